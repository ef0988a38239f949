//! Who the node is: its hostname and the SSH keys root logs in with.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::system::System;
use emberrtos_contract::io::root::ImageRoot;
use emberrtos_contract::provision::Provision;

/// Writes `/etc/hostname` and, on the device, sets the running hostname.
/// `hostname` was validated by the provision parser (RFC 1123).
pub fn set_hostname(system: &System, hostname: &str) -> Result<()> {
    system.root.write(
        Path::new("etc/hostname"),
        format!("{hostname}\n").as_bytes(),
        0o644,
    )?;
    if system.live {
        // SAFETY: the pointer and length describe `hostname`'s bytes.
        let rc = unsafe { libc::sethostname(hostname.as_ptr().cast(), hostname.len()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("sethostname");
        }
    }
    Ok(())
}

/// Root's home directory in `passwd` text: the sixth field of the `root`
/// entry, an absolute path. (On an ostree image `/root` is a link into
/// `/var/roothome`; the caller follows it.)
pub fn root_home(passwd: &str) -> Result<PathBuf> {
    let entry = passwd
        .lines()
        .find(|line| line.split(':').next() == Some("root"))
        .context("/etc/passwd has no root entry")?;
    let home = entry
        .split(':')
        .nth(5)
        .filter(|home| home.starts_with('/'))
        .with_context(|| format!("root's entry in /etc/passwd has no absolute home directory: {entry:?}"))?;
    Ok(PathBuf::from(home))
}

/// Installs the medium's keys for root: a 0700 `.ssh` holding a 0600
/// `authorized_keys`, both root's. Only a parsed [`Provision`] supplies
/// them, so the file holds validated keys, each once, within the caps of
/// `provision::MAX_AUTHORIZED_KEYS` and `MAX_AUTHORIZED_KEYS_BYTES`.
/// Everything is written inside root's home: a link there (`.ssh -> /etc`)
/// is replaced, never followed out. Returns the home as seen on the device.
pub fn install_root_keys(system: &System, provision: &Provision) -> Result<PathBuf> {
    let passwd =
        String::from_utf8(system.root.read(Path::new("etc/passwd"))?).context("/etc/passwd is not UTF-8")?;
    let home = root_home(&passwd)?;
    let (tree, in_tree) = system.place(&home)?;
    if in_tree.as_os_str().is_empty() {
        bail!("root's home {} is the root of a filesystem tree", home.display());
    }
    tree.create_dir_all(&in_tree, 0o700)?;
    let home_root = ImageRoot::open(&tree.real_dir(&in_tree)?)?;
    let ssh = Path::new(".ssh");
    if home_root.symlink_metadata(ssh)?.is_some_and(|m| !m.is_dir()) {
        home_root.remove(ssh)?;
    }
    home_root.create_dir_all(ssh, 0o700)?;
    home_root.set_attr(ssh, 0o700, 0, 0)?;
    let keys = ssh.join("authorized_keys");
    home_root.write(&keys, provision.authorized_keys().as_bytes(), 0o600)?;
    home_root.set_attr(&keys, 0o600, 0, 0)?;
    Ok(home)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_home_comes_from_the_root_entry() {
        let passwd = "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\nroot:x:0:0:root:/root:/bin/bash\n";
        assert_eq!(root_home(passwd).unwrap(), PathBuf::from("/root"));
        assert_eq!(
            root_home("root:x:0:0::/var/roothome:/bin/sh").unwrap(),
            PathBuf::from("/var/roothome")
        );
        assert!(root_home("rooty:x:0:0::/root:/bin/sh").is_err());
        assert!(root_home("root:x:0:0::relative:/bin/sh").is_err());
        assert!(root_home("root:x:0").is_err());
    }
}
