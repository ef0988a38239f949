//! Commands that are not pipeline stages.

pub mod cache;
pub mod config_medium;
pub mod cve;
pub mod cve_db;
pub mod diff;
pub mod publish;
pub mod vm;
