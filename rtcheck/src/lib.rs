//! PREEMPT_RT evidence shared by the imgbuild gate and the on-target `jitter`
//! tool: one implementation of "is this kernel PREEMPT_RT".
//!
//! Everything here is a pure function over bytes or text; callers do the I/O
//! (but for [`container::lock_cpu`], the per-CPU lock both tools share).
//! [`jitter`] holds the data types of jitter's JSON report and of its
//! `--progress` lines, which both read.

#[cfg(feature = "image")]
pub mod bzimage;
#[cfg(feature = "cli-docs")]
pub mod cli_docs;
pub mod container;
pub mod elf;
pub mod evidence;
pub mod ikconfig;
pub mod jitter;
pub mod kconfig;
mod progress;
pub mod tail;
pub mod utc;
pub mod uts;
pub mod vermagic;

pub use evidence::{Check, CheckId, Evidence, RequiredFor, Status, required_checks};
