//! Where things live on an EmberRTOS image and device: the agent's install
//! path and the names it answers to, the latency tool of trial boots, and
//! the update remote. The rootfs stage installs to these paths; the device
//! dispatches on these names.

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
/// `jitter` on PATH: a link to [`JITTER_INSTALL_PATH`], for a soak under
/// the application's own load on the installed machine.
pub const JITTER_LINK: &str = "usr/bin/jitter";
/// Where jitter's man pages go (`jitter.1.gz`).
pub const MAN1_DIR: &str = "usr/share/man/man1";
/// The ostree remote a configuration medium configures (`imgbuild disk
/// --remote-url` names it the same).
pub const REMOTE: &str = "emberrtos";
