//! PREEMPT_RT evidence shared by the imgbuild gate, the device and the
//! on-target `jitter` tool: one implementation of "is this kernel
//! PREEMPT_RT".
//!
//! Everything here is a pure function over bytes or text; callers do the I/O.
//! What a latency measurement reports is the `rtreport` crate's.

pub mod arch;
#[cfg(feature = "image")]
pub mod arm64;
#[cfg(feature = "image")]
pub mod bzimage;
pub mod elf;
pub mod evidence;
pub mod ikconfig;
pub mod kconfig;
pub mod uts;
pub mod vermagic;

pub use arch::Arch;
pub use evidence::{Check, CheckId, Evidence, RequiredFor, Status, required_checks};
