//! Secrets and build-host identity that must not ship in an image.
//!
//! Every device installed from one commit shares its files, and `publish`
//! serves them to anyone who pulls. So the tree is stripped at compose time
//! (paths as the Debian tree has them, before the ostree layout moves `/etc`
//! to `/usr/etc`) of:
//!
//! - `/etc/ssh/ssh_host_*`: generated on first boot instead, by
//!   `emberrtos-ssh-hostkeys.service` in overlays/base;
//! - `/etc/hostname`: the build host's name. Left absent rather than set to
//!   `localhost`: with no static hostname systemd uses its fallback
//!   (`localhost` on Debian) and still accepts a name from DHCP, which a
//!   static `localhost` would block; an operator's own `/etc/hostname`
//!   survives upgrades through ostree's `/etc` merge;
//! - `/etc/resolv.conf` with the build host's content: a link to
//!   systemd-resolved's stub file when the tree has systemd-resolved,
//!   otherwise absent so the network service of the device writes it. A
//!   symlink is kept: it holds no host content;
//! - `/etc/machine-id`: emptied, so systemd generates the device's own on
//!   first boot (the machine-id(5) convention for images);
//!   `/var/lib/dbus/machine-id` unless it links to it;
//! - `/var/lib/systemd/random-seed` and `credential.secret`.
//!
//! [`refuse_private_keys`] then fails the build when any private key is
//! left anywhere in the tree.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use emberrtos_contract::io::root::ImageRoot;
pub use emberrtos_contract::secrets::private_key_label;

/// What [`strip_host_identity`] removed or reset, as absolute paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stripped {
    pub removed: Vec<PathBuf>,
    /// Rewritten to a neutral value (empty `machine-id`, `resolv.conf` link).
    pub reset: Vec<PathBuf>,
}

impl Stripped {
    /// One line for the build log.
    pub fn summary(&self) -> String {
        let names = |paths: &[PathBuf]| {
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match (self.removed.is_empty(), self.reset.is_empty()) {
            (true, true) => "nothing to strip".into(),
            _ => format!(
                "removed [{}], reset [{}]",
                names(&self.removed),
                names(&self.reset)
            ),
        }
    }
}

const SSH_DIR: &str = "/etc/ssh";
const HOST_KEY_PREFIX: &str = "ssh_host_";
const MACHINE_ID: &str = "/etc/machine-id";
const RESOLV_CONF: &str = "/etc/resolv.conf";
const RESOLVED_STUB: &str = "../run/systemd/resolve/stub-resolv.conf";
const RESOLVED_BINARIES: &[&str] = &[
    "/usr/lib/systemd/systemd-resolved",
    "/lib/systemd/systemd-resolved",
];
/// Removed whatever they are.
const HOST_FILES: &[&str] = &[
    "/etc/hostname",
    "/var/lib/systemd/random-seed",
    "/var/lib/systemd/credential.secret",
];

/// Strips the build host's identity and per-machine secrets from the tree.
pub fn strip_host_identity(root: &ImageRoot) -> Result<Stripped> {
    let mut stripped = Stripped::default();
    for key in ssh_host_keys(root)? {
        remove(root, &key, &mut stripped)?;
    }
    for file in HOST_FILES {
        remove(root, Path::new(file), &mut stripped)?;
    }
    let dbus_id = Path::new("/var/lib/dbus/machine-id");
    if !is_symlink(root, dbus_id)? {
        remove(root, dbus_id, &mut stripped)?;
    }
    reset_resolv_conf(root, &mut stripped)?;
    if root.is_dir(Path::new("/etc")) {
        root.write(Path::new(MACHINE_ID), b"", 0o444)?;
        stripped.reset.push(MACHINE_ID.into());
    }
    Ok(stripped)
}

fn ssh_host_keys(root: &ImageRoot) -> Result<Vec<PathBuf>> {
    if !root.is_dir(Path::new(SSH_DIR)) {
        return Ok(Vec::new());
    }
    Ok(root
        .list(Path::new(SSH_DIR))?
        .into_iter()
        .filter(|name| name.to_string_lossy().starts_with(HOST_KEY_PREFIX))
        .map(|name| Path::new(SSH_DIR).join(name))
        .collect())
}

fn remove(root: &ImageRoot, path: &Path, stripped: &mut Stripped) -> Result<()> {
    if root.symlink_metadata(path)?.is_some() {
        root.remove(path)?;
        stripped.removed.push(path.to_path_buf());
    }
    Ok(())
}

fn is_symlink(root: &ImageRoot, path: &Path) -> Result<bool> {
    Ok(root
        .symlink_metadata(path)?
        .is_some_and(|m| m.file_type().is_symlink()))
}

fn reset_resolv_conf(root: &ImageRoot, stripped: &mut Stripped) -> Result<()> {
    let path = Path::new(RESOLV_CONF);
    if root.symlink_metadata(path)?.is_none() || is_symlink(root, path)? {
        return Ok(());
    }
    if RESOLVED_BINARIES.iter().any(|b| root.is_file(Path::new(b))) {
        root.symlink(path, Path::new(RESOLVED_STUB))?;
        stripped.reset.push(path.to_path_buf());
    } else {
        remove(root, path, stripped)?;
    }
    Ok(())
}

/// Private keys found in an image tree: the build fails on them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the image tree holds private keys, which every device and anyone who pulls would share: {}", list(.found))]
pub struct PrivateKeysFound {
    /// Absolute paths in the tree, with the PEM label found.
    pub found: Vec<(PathBuf, String)>,
}

fn list(found: &[(PathBuf, String)]) -> String {
    found
        .iter()
        .map(|(path, label)| format!("{} ({label})", path.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Key files are small; larger files are not read.
pub const SCAN_MAX_FILE_BYTES: u64 = 64 * 1024;
/// How much of each file is searched for a PEM header.
pub const SCAN_HEAD_BYTES: usize = 16 * 1024;

/// What [`refuse_private_keys`] looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scanned {
    pub files: u64,
    pub bytes: u64,
}

/// Fails with [`PrivateKeysFound`], naming every file, when a regular file of
/// the tree (at most [`SCAN_MAX_FILE_BYTES`]) holds a PEM or OpenSSH private
/// key in its first [`SCAN_HEAD_BYTES`].
///
/// A read-only walk of the tree's host path that follows no link: walkdir
/// lists without following, and each file is opened `O_NOFOLLOW` (the
/// confined resolver costs ~10x more per file and buys nothing for a read
/// of entries the walk just listed as regular files).
pub fn refuse_private_keys(root: &ImageRoot) -> Result<Scanned> {
    let mut scanned = Scanned::default();
    let mut found = Vec::new();
    let mut head = Vec::with_capacity(SCAN_HEAD_BYTES);
    for entry in walkdir::WalkDir::new(root.path()) {
        let entry = entry.with_context(|| format!("walking {}", root.path().display()))?;
        if !entry.file_type().is_file() || entry.metadata()?.len() > SCAN_MAX_FILE_BYTES {
            continue;
        }
        head.clear();
        crate::io::open_nofollow(entry.path())
            .and_then(|file| file.take(SCAN_HEAD_BYTES as u64).read_to_end(&mut head))
            .with_context(|| format!("reading {}", entry.path().display()))?;
        let rel = Path::new("/").join(entry.path().strip_prefix(root.path()).expect("inside"));
        scanned.files += 1;
        scanned.bytes += head.len() as u64;
        if let Some(label) = private_key_label(&head) {
            found.push((rel, label));
        }
    }
    if found.is_empty() {
        Ok(scanned)
    } else {
        Err(PrivateKeysFound { found }.into())
    }
}
