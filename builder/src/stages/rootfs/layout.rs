//! Converts a plain rootfs into the layout an ostree commit needs.
//!
//! - `/etc` moves to `/usr/etc` (ostree merges it into `/etc` at deploy).
//! - `/var` is empty in the commit. What the packages put there moves to
//!   `/usr/share/factory/var`, and `usr/lib/tmpfiles.d/imgbuild-var.conf`
//!   recreates it on first boot (`d` for directories, `C` for files, `L` for
//!   symlinks), so nothing is lost and `/var` stays the device's own.
//! - `/home`, `/root`, `/opt`, `/srv`, `/mnt`, `/usr/local` become symlinks
//!   into `/var`, `/media` into `/run`, and `/ostree` into `/sysroot/ostree`;
//!   their contents move into `/var` first.
//! - `/sysroot`, `/boot`, `/dev`, `/proc`, `/sys`, `/run`, `/tmp` are empty.

use std::fmt::Write as _;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub const TMPFILES: &str = "usr/lib/tmpfiles.d/imgbuild-var.conf";
pub const FACTORY_VAR: &str = "usr/share/factory/var";

/// Top-level directories that become symlinks, with their targets.
pub const VAR_LINKS: &[(&str, &str, &str)] = &[
    // (path, symlink target, directory under /var holding the content)
    ("home", "var/home", "home"),
    ("root", "var/roothome", "roothome"),
    ("opt", "var/opt", "opt"),
    ("srv", "var/srv", "srv"),
    ("mnt", "var/mnt", "mnt"),
    ("usr/local", "../var/usrlocal", "usrlocal"),
];

/// Directories that must exist and be empty, with their modes.
pub const EMPTY_DIRS: &[(&str, u32)] = &[
    ("boot", 0o755),
    ("dev", 0o755),
    ("proc", 0o555),
    ("run", 0o755),
    ("sys", 0o555),
    ("sysroot", 0o755),
    ("tmp", 0o1777),
    ("var", 0o755),
];

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LayoutReport {
    /// Lines in the generated tmpfiles.d file.
    pub tmpfiles_entries: usize,
    /// Files moved from /var to the factory.
    pub factory_files: usize,
}

fn empty_dir(path: &Path, mode: u32) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => {
            for entry in std::fs::read_dir(path)? {
                let entry = entry?;
                if entry.file_type()?.is_dir() {
                    std::fs::remove_dir_all(entry.path())?;
                } else {
                    std::fs::remove_file(entry.path())?;
                }
            }
        }
        Ok(_) => {
            std::fs::remove_file(path)?;
            std::fs::create_dir(path)?;
        }
        Err(_) => std::fs::create_dir_all(path)?,
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

/// Moves the contents of `from` into `to` (merging directories).
fn move_contents(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() && dest.is_dir() {
            move_contents(&entry.path(), &dest)?;
            std::fs::remove_dir(entry.path())?;
        } else {
            std::fs::rename(entry.path(), &dest)
                .with_context(|| format!("moving {} to {}", entry.path().display(), dest.display()))?;
        }
    }
    Ok(())
}

fn symlink_replacing(target: &str, link: &Path) -> Result<()> {
    match std::fs::symlink_metadata(link) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(link)?,
        Ok(_) => std::fs::remove_file(link)?,
        Err(_) => {}
    }
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::os::unix::fs::symlink(target, link).with_context(|| format!("creating symlink {}", link.display()))
}

/// Converts `root` in place.
pub fn convert(root: &Path) -> Result<LayoutReport> {
    let usr_etc = root.join("usr/etc");
    if usr_etc.exists() {
        bail!(
            "{} already exists: the tree is already in ostree layout",
            usr_etc.display()
        );
    }
    if root.join("etc").is_dir() {
        std::fs::rename(root.join("etc"), &usr_etc).context("moving /etc to /usr/etc")?;
    }
    std::fs::create_dir_all(root.join("var"))?;
    for (path, target, var_name) in VAR_LINKS {
        let dir = root.join(path);
        let meta = std::fs::symlink_metadata(&dir);
        if meta.as_ref().is_ok_and(|m| m.is_dir()) {
            let in_var = root.join("var").join(var_name);
            move_contents(&dir, &in_var)?;
            let mode = meta.expect("checked").mode() & 0o7777;
            std::fs::set_permissions(&in_var, std::fs::Permissions::from_mode(mode))?;
        }
        symlink_replacing(target, &dir)?;
    }
    symlink_replacing("run/media", &root.join("media"))?;
    symlink_replacing("sysroot/ostree", &root.join("ostree"))?;

    let report = move_var_to_factory(root)?;
    for (dir, mode) in EMPTY_DIRS {
        empty_dir(&root.join(dir), *mode)?;
    }
    Ok(report)
}

/// Moves `/var` into the factory and writes the tmpfiles.d entries.
fn move_var_to_factory(root: &Path) -> Result<LayoutReport> {
    let var = root.join("var");
    let factory = root.join(FACTORY_VAR);
    let mut lines = String::from(
        "# Generated by imgbuild: recreates /var, which an ostree commit leaves empty.\n\
         # Files come from /usr/share/factory/var.\n",
    );
    let mut report = LayoutReport::default();
    let mut entries: Vec<(PathBuf, std::fs::Metadata)> = Vec::new();
    for entry in walkdir::WalkDir::new(&var).min_depth(1).sort_by_file_name() {
        let entry = entry?;
        let rel = entry
            .path()
            .strip_prefix(&var)
            .expect("inside /var")
            .to_path_buf();
        entries.push((rel, entry.path().symlink_metadata()?));
    }
    for (rel, meta) in &entries {
        let target = Path::new("/var").join(rel);
        let owner = |m: &std::fs::Metadata| (m.uid(), m.gid());
        let (uid, gid) = owner(meta);
        if meta.file_type().is_symlink() {
            let link = std::fs::read_link(var.join(rel))?;
            writeln!(lines, "L {} - - - - {}", target.display(), link.display())?;
        } else if meta.is_dir() {
            writeln!(
                lines,
                "d {} {:04o} {uid} {gid} -",
                target.display(),
                meta.mode() & 0o7777
            )?;
        } else if meta.is_file() {
            let dest = factory.join(rel);
            std::fs::create_dir_all(dest.parent().expect("has a parent"))?;
            std::fs::rename(var.join(rel), &dest)?;
            writeln!(
                lines,
                "C {} - - - - {}",
                target.display(),
                Path::new("/").join(FACTORY_VAR).join(rel).display()
            )?;
            report.factory_files += 1;
        } else {
            // Sockets and FIFOs under /var are runtime state; recreate nothing.
            continue;
        }
        report.tmpfiles_entries += 1;
    }
    let tmpfiles = root.join(TMPFILES);
    std::fs::create_dir_all(tmpfiles.parent().expect("has a parent"))?;
    std::fs::write(&tmpfiles, lines)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_a_small_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in [
            "etc",
            "var/lib/dpkg",
            "var/log",
            "home",
            "root",
            "usr/local/bin",
            "usr/bin",
            "boot",
            "dev",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("etc/hostname"), "ember\n").unwrap();
        std::fs::write(root.join("var/lib/dpkg/status"), "Package: x\n").unwrap();
        std::fs::write(root.join("root/.profile"), "PS1=#\n").unwrap();
        std::fs::write(root.join("boot/vmlinuz-old"), "k").unwrap();
        std::os::unix::fs::symlink("/run/lock", root.join("var/lock")).unwrap();
        std::fs::set_permissions(root.join("root"), std::fs::Permissions::from_mode(0o700)).unwrap();

        let report = convert(root).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("usr/etc/hostname")).unwrap(),
            "ember\n"
        );
        assert!(!root.join("etc").exists());
        assert_eq!(std::fs::read_dir(root.join("var")).unwrap().count(), 0);
        assert_eq!(
            std::fs::read_link(root.join("home")).unwrap(),
            PathBuf::from("var/home")
        );
        assert_eq!(
            std::fs::read_link(root.join("root")).unwrap(),
            PathBuf::from("var/roothome")
        );
        assert_eq!(
            std::fs::read_link(root.join("usr/local")).unwrap(),
            PathBuf::from("../var/usrlocal")
        );
        assert_eq!(
            std::fs::read_link(root.join("ostree")).unwrap(),
            PathBuf::from("sysroot/ostree")
        );
        assert_eq!(std::fs::read_dir(root.join("boot")).unwrap().count(), 0);
        assert_eq!(
            std::fs::read_to_string(root.join("usr/share/factory/var/roothome/.profile")).unwrap(),
            "PS1=#\n"
        );
        let tmpfiles = std::fs::read_to_string(root.join(TMPFILES)).unwrap();
        assert!(tmpfiles.contains("d /var/roothome 0700 "), "{tmpfiles}");
        assert!(tmpfiles.contains("C /var/lib/dpkg/status - - - - /usr/share/factory/var/lib/dpkg/status"));
        assert!(tmpfiles.contains("L /var/lock - - - - /run/lock"));
        assert!(tmpfiles.contains("d /var/usrlocal/bin 0755 "));
        assert_eq!(report.factory_files, 2);
        assert_eq!(
            std::fs::metadata(root.join("tmp")).unwrap().mode() & 0o7777,
            0o1777
        );
        // Converting twice is refused rather than mangling the tree.
        assert!(convert(root).is_err());
    }
}
