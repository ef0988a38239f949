//! What the agent asks of the machine itself: that `/boot` be on disk for
//! GRUB, and a reboot.

use anyhow::{Context, Result, bail};

use super::system::System;

/// `_IOWR('X', 119, int)` and `_IOWR('X', 120, int)` of `<linux/fs.h>`.
const FIFREEZE: u64 = 0xC004_5877;
const FITHAW: u64 = 0xC004_5878;

/// Puts what libostree wrote to `/boot` at its final place on disk, for
/// GRUB, which reads the filesystem without replaying its journal: a
/// freeze/thaw cycle makes ext4 checkpoint the journal. libostree 2022.7
/// does one before it swaps `/boot/loader` but only fsyncs after the swap
/// (upstream freezes again since 2025.2, commit 1b3ba40f), and a reboot
/// right after a deploy then left GRUB hanging on a half-written /boot.
/// Where freezing is not supported (tmpfs, a scratch sysroot) it syncs.
pub fn flush_boot(system: &System) -> Result<()> {
    use std::os::fd::AsRawFd;
    let boot = system.path.join("boot");
    let dir = std::fs::File::open(&boot).with_context(|| format!("opening {}", boot.display()))?;
    let fd = dir.as_raw_fd();
    // SAFETY: `fd` is an open descriptor owned by `dir`; the ioctls take no
    // argument, syncfs only the descriptor.
    unsafe {
        if libc::ioctl(fd, FIFREEZE as libc::Ioctl, 0) != 0 {
            let error = std::io::Error::last_os_error();
            let unsupported = [
                libc::EOPNOTSUPP,
                libc::ENOTTY,
                libc::ENOSYS,
                libc::EPERM,
                libc::EBUSY,
            ];
            if !unsupported.contains(&error.raw_os_error().unwrap_or_default()) {
                return Err(error).with_context(|| format!("freezing {}", boot.display()));
            }
            if libc::syncfs(fd) != 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("syncing {}", boot.display()));
            }
            return Ok(());
        }
        if libc::ioctl(fd, FITHAW as libc::Ioctl, 0) != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("thawing {}", boot.display()));
        }
    }
    Ok(())
}

/// Asks systemd to reboot; the command returns once the request is queued.
pub fn reboot() -> Result<()> {
    let status = std::process::Command::new("systemctl")
        .arg("reboot")
        .status()
        .context("running `systemctl reboot`")?;
    if !status.success() {
        bail!("`systemctl reboot` failed ({status})");
    }
    Ok(())
}
