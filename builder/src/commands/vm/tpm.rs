//! `vm --tpm DIR`: a TPM 2.0 for the guest, emulated by swtpm with its state
//! in DIR. The first use manufactures it (`swtpm_setup`: a new EK, and its
//! certificate from swtpm's local CA); later runs boot with the same TPM, so
//! a guest keeps its hardware identity and another DIR is another machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use anyhow::{Context, Result};

use crate::io::qemu;
use crate::tool;
use rtcheck::Arch;

/// swtpm's state file of a manufactured TPM 2.0.
const STATE_FILE: &str = "tpm2-00.permall";

/// A running swtpm, killed with the guest.
pub struct Swtpm {
    child: Child,
    pub socket: PathBuf,
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Manufactures the TPM in `state` unless it already holds one.
fn manufacture(state: &Path, log: &Path) -> Result<bool> {
    if state.join(STATE_FILE).is_file() {
        return Ok(false);
    }
    std::fs::create_dir_all(state).with_context(|| format!("creating --tpm {}", state.display()))?;
    tool::run(
        tool::command("swtpm_setup")?
            .args(["--tpm2", "--create-ek-cert", "--lock-nvram", "--tpmstate"])
            .arg(state)
            .arg("--logfile")
            .arg(log),
    )
    .with_context(|| {
        format!(
            "manufacturing a TPM in --tpm {} (log: {})",
            state.display(),
            log.display()
        )
    })?;
    Ok(true)
}

/// Starts swtpm on `state` with its control socket in `scratch`; returns it
/// and whether the TPM was new.
pub fn start(state: &Path, scratch: &Path) -> Result<(Swtpm, bool)> {
    let new = manufacture(state, &scratch.join("swtpm_setup.log"))?;
    let socket = scratch.join("swtpm.sock");
    let mut cmd = tool::command("swtpm")?;
    let child = tool::die_with_parent(&mut cmd)
        .args(["socket", "--tpm2", "--terminate", "--tpmstate"])
        .arg(format!("dir={}", qemu::escape(state)))
        .args(["--ctrl", &format!("type=unixio,path={}", qemu::escape(&socket))])
        .arg("--log")
        .arg(format!("file={}", qemu::escape(&scratch.join("swtpm.log"))))
        .stdin(Stdio::null())
        .spawn()
        .context("starting swtpm")?;
    wait_for_socket(&socket)?;
    Ok((Swtpm { child, socket }, new))
}

fn wait_for_socket(socket: &Path) -> Result<()> {
    for _ in 0..100 {
        if socket.exists() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    anyhow::bail!("swtpm did not open its socket {} within 5 s", socket.display())
}

/// QEMU's options for the TPM at `socket`: TIS on the PC, its MMIO form on
/// the arm64 `virt` board.
pub fn qemu_args(socket: &Path, arch: Arch) -> Vec<String> {
    let device = match arch {
        Arch::X86_64 => "tpm-tis,tpmdev=tpm0",
        Arch::Arm64 => "tpm-tis-device,tpmdev=tpm0",
    };
    [
        "-chardev",
        &format!("socket,id=tpmchr,path={}", qemu::escape(socket)),
        "-tpmdev",
        "emulator,id=tpm0,chardev=tpmchr",
        "-device",
        device,
    ]
    .map(String::from)
    .to_vec()
}
