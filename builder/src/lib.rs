//! imgbuild: builds an immutable Linux OS whose RT flavor runs a mainline
//! PREEMPT_RT kernel, and refuses to tag anything it cannot prove is RT.
//!
//! The device agent is its own crate (`emberrtos-device`); the rules both
//! sides share are the commit contract (`emberrtos-contract`).
//! `stages` holds one module per pipeline stage, `pipeline` chains them
//! through the stage protocol in `stage`, `commands` holds the commands that
//! are not stages, and `io` the stage-agnostic helpers, among them the
//! confined root every write into an image tree goes through.

pub mod cache;
pub mod cli;
pub mod commands;
pub mod cve;
pub mod economics;
pub mod io;
pub mod ostree;
pub mod pipeline;
pub mod qualify;
pub mod recipe;
pub mod sbom;
pub mod secure_boot;
pub mod site;
pub mod stage;
pub mod stages;
pub mod summary;
pub mod tool;
pub mod transport;
pub mod ui;
pub mod version;
