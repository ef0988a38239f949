//! Stage-agnostic helpers: the confined root (every write into an image
//! tree), hashing, archive extraction, initramfs writing, QEMU.

pub mod extract;
pub mod gpg;
pub mod hashing;
pub mod initramfs;
pub mod qemu;
pub mod records;
pub mod root;
