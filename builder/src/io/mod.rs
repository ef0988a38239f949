//! Stage-agnostic helpers: the confined root (every write into an image
//! tree), hashing, archive extraction, initramfs writing, QEMU.

pub mod extract;
pub mod gpg;
pub mod hashing;
pub mod initramfs;
pub mod qemu;
pub mod records;
pub mod root;

/// Opens `path` for reading without following a symlink at its last
/// component, and without blocking on a FIFO swapped in for a file.
pub fn open_nofollow(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}
