//! The integration tests of imgbuild: one test binary, one module per area.
//! Tests that need the network or fetched fixtures sit behind the
//! `fixtures` feature (ci/test turns it on).

mod common;

mod boot_initramfs;
mod cli;
mod config_medium;
mod confinement;
mod cve;
mod device;
mod diff;
mod disk;
mod extract;
mod fetch;
mod kernel;
mod kernel_farm;
mod layers;
mod live;
mod ostree_repo;
mod packaging;
mod publish;
mod qualify;
mod rootfs;
mod secrets;
mod secure_boot;
mod site;
mod vm;
