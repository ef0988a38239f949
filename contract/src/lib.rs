//! The EmberRTOS commit contract: what an EmberRTOS commit is and how it is
//! judged, shared by the builder (`imgbuild`) and the device agent
//! (`emberrtos-device`) so that nothing is defined twice.
//!
//! - [`flavor`]: the two flavors and how a ref names its flavor;
//! - [`commit`]: the metadata keys every commit carries, and their readers;
//! - [`gate`]: the RT gate, which re-verifies a commit's kernel and evidence
//!   at tag, publish, disk and on the device ([`gate::gate_commit_as`]);
//! - [`policy`]: what a commit asks of its own trial boots;
//! - [`boot`]: GRUB's environment-block variables of a trial boot;
//! - [`paths`]: install paths in the image and the agent's names;
//! - [`provision`]: the `provision.yaml` schema of the configuration medium,
//!   with [`syntax`] (pure field checks) and [`yaml`] (field positions);
//! - [`error`]: the exit codes and the errors callers match;
//! - [`verity`]: fs-verity digests and the manifest of a tree's `usr/`;
//! - [`ostree`], [`tree`], [`io`], [`secrets`]: the libostree reads, commit
//!   tree walks, confined root and key checks the rules above rest on.
//!
//! See docs/ARCHITECTURE.md for the layers around this crate.

pub mod boot;
pub mod commit;
pub mod error;
pub mod flavor;
pub mod gate;
pub mod io;
pub mod ostree;
pub mod paths;
pub mod policy;
pub mod provision;
pub mod secrets;
pub mod secure_boot;
pub mod syntax;
pub mod tree;
pub mod verity;
pub mod yaml;
