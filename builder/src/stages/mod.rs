//! One module per pipeline stage, in pipeline order.

pub mod boot;
pub mod commit;
pub mod disk;
pub mod fetch;
pub mod iso;
pub mod kernel;
pub mod rootfs;
pub mod tag;
pub mod verify;
