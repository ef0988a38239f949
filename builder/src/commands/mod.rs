//! Commands that are not pipeline stages.

pub mod publish;
pub mod vm;
