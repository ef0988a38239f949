//! The device side of the OS: `emberrtos-device`, the one binary every image
//! ships (at [`INSTALL_PATH`]), for first-boot provisioning and for updates
//! (DESIGN.md, "Device contract").
//!
//! - [`provision`]: `emberrtos-provision.service` runs it once per device,
//!   before SSH starts. It reads the configuration medium, sets the hostname,
//!   root's SSH keys and the update remote, and for `flavor: rt` resolves,
//!   verifies ON THE DEVICE and deploys the RT commit, or refuses and says why.
//! - [`status`], [`upgrade`], [`rollback`]: `emberrtos-update` (a link to the
//!   same binary) over the deployments libostree keeps.
//! - [`rt_run`]: `emberrtos-rt-run` (another link), a container on one
//!   isolated CPU of an RT deployment.
//!
//! Every command works on an explicit sysroot: `/` on the device (the booted
//! deployment with its live `/etc` and `/var`), or a scratch sysroot made with
//! `ostree admin` in tests (its default deployment stands in for the booted
//! one; see [`system::System`]).

pub mod cli;
pub mod deploy;
pub mod grubenv;
pub mod health;
pub mod identity;
pub mod medium;
pub mod policy;
pub mod provision;
pub mod record;
pub mod rollback;
pub mod rt_run;
pub mod status;
pub mod system;
pub mod upgrade;

/// Where the rootfs stage installs the binary, relative to the tree.
pub const INSTALL_PATH: &str = "usr/libexec/emberrtos/emberrtos-device";
/// `emberrtos-update`: a link to [`INSTALL_PATH`]; the binary dispatches on its name.
pub const UPDATE_LINK: &str = "usr/bin/emberrtos-update";
/// The name the update command answers to.
pub const UPDATE_NAME: &str = "emberrtos-update";
/// `emberrtos-rt-run`: a link to [`INSTALL_PATH`], the `rt-run` command.
pub const RT_RUN_LINK: &str = "usr/bin/emberrtos-rt-run";
/// The name the RT container command answers to.
pub const RT_RUN_NAME: &str = "emberrtos-rt-run";
/// Where the rootfs stage installs `jitter`, the latency check of trial boots.
pub const JITTER_INSTALL_PATH: &str = "usr/libexec/emberrtos/jitter";
/// The ostree remote a configuration medium configures (`imgbuild disk
/// --remote-url` names it the same).
pub const REMOTE: &str = "emberrtos";
