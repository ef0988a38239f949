//! The device side of the OS: `emberrtos-device`, the one binary every image
//! ships (at [`INSTALL_PATH`](emberrtos_contract::paths::INSTALL_PATH)), for first-boot provisioning and for updates
//! (docs/ARCHITECTURE.md, "The device contract").
//!
//! - [`provision`]: `emberrtos-provision.service` runs it once per device,
//!   before SSH starts. It reads the configuration medium, sets the hostname,
//!   root's SSH keys and the update remote, and for `flavor: rt` resolves,
//!   verifies ON THE DEVICE and deploys the RT commit, or refuses and says why.
//! - [`secure_boot`]: with the firmware's Secure Boot on, provisioning and
//!   upgrades refuse a commit whose kernel no `db` certificate signed.
//! - [`verity`]: the health check's proof that `/usr` is the commit's:
//!   every file sealed with fs-verity and measured against the manifest.
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
mod deploy;
pub mod grubenv;
mod health;
mod identity;
mod machine;
mod medium;
mod provision;
mod record;
mod rollback;
mod rt_run;
mod secure_boot;
mod status;
mod system;
mod upgrade;
mod verity;
