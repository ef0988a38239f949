//! Stage-agnostic helpers: hashing, archive extraction, initramfs writing.

pub mod extract;
pub mod hashing;
pub mod initramfs;
