//! Stage-agnostic helpers: the confined root (every write into an image
//! tree), hashing, archive extraction, initramfs writing.

pub mod extract;
pub mod hashing;
pub mod initramfs;
pub mod root;
