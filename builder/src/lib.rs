//! imgbuild: builds an immutable Linux OS whose RT flavor runs a mainline
//! PREEMPT_RT kernel, and refuses to tag anything it cannot prove is RT.
//!
//! Each pipeline stage is a module; `pipeline` chains them with cache keys.

pub mod boot;
pub mod cache;
pub mod cli;
pub mod commit;
pub mod error;
pub mod extract;
pub mod fetch;
pub mod hashing;
pub mod initramfs;
pub mod kernel;
pub mod live;
pub mod ostree;
pub mod pipeline;
pub mod publish;
pub mod recipe;
pub mod rootfs;
pub mod tag;
pub mod tool;
pub mod ui;
pub mod verify;
