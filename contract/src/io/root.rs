//! The confined root: the one way to write into an image tree.
//!
//! An image tree (a rootfs, the live root, an initramfs staging dir) comes
//! from hostile input: a base tarball or an overlay may hold
//! `var -> /host/dir` or `usr/lib/modules -> ../../../..`. Every path given
//! to [`ImageRoot`] is resolved inside the tree the way the target will see
//! it, as `openat2(RESOLVE_IN_ROOT)` does: `..` stops at the root and
//! absolute symlinks are re-rooted. The last component is never followed by
//! a write, rename or remove: a symlink there is replaced, not written
//! through. Resolution is done by `pathrs` (libpathrs), which uses
//! `openat2` where the kernel has it and a checked userspace walk elsewhere.
//!
//! Paths are relative to the tree; a leading `/` is allowed and means the
//! same (`/etc/x` is `etc/x`).

use std::fs::{File, Metadata, Permissions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use pathrs::flags::{OpenFlags, RenameFlags};
use pathrs::{InodeType, Root};

/// An image tree that every write goes through.
#[derive(Debug)]
pub struct ImageRoot {
    path: PathBuf,
    root: Root,
}

/// What [`ImageRoot::copy_tree_in`] copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
}

/// Bytes and number of the regular files under a directory (links not followed).
pub fn tree_size(dir: &Path) -> Result<(u64, u64)> {
    let (mut bytes, mut files) = (0, 0);
    for entry in walkdir::WalkDir::new(dir) {
        let entry = entry.with_context(|| format!("walking {}", dir.display()))?;
        if entry.file_type().is_file() {
            bytes += entry.metadata()?.len();
            files += 1;
        }
    }
    Ok((bytes, files))
}

/// `path` as a tree-relative path: no root, no `.`; `..` is kept for the
/// resolver, which stops it at the root.
fn relative(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| !matches!(c, Component::RootDir | Component::CurDir))
        .collect()
}

fn split_parent(rel: &Path) -> Result<(PathBuf, std::ffi::OsString)> {
    let rel = relative(rel);
    match rel.components().next_back() {
        Some(Component::Normal(name)) => Ok((
            rel.parent().map(Path::to_path_buf).unwrap_or_default(),
            name.to_os_string(),
        )),
        _ => bail!("{} does not end in a name", rel.display()),
    }
}

impl ImageRoot {
    /// Opens an existing tree.
    pub fn open(path: &Path) -> Result<ImageRoot> {
        let root = Root::open(path).with_context(|| format!("opening image tree {}", path.display()))?;
        Ok(ImageRoot {
            path: path.to_path_buf(),
            root,
        })
    }

    /// Creates the directory (and its parents, outside any image tree) and opens it.
    pub fn create(path: &Path) -> Result<ImageRoot> {
        std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        ImageRoot::open(path)
    }

    /// The tree's directory on the host, for tools that only read it (ostree
    /// commit, mkfs -d) and for walks that do not follow links.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, what: &str, rel: &Path) -> String {
        format!("{what} /{} in {}", relative(rel).display(), self.path.display())
    }

    /// Creates a directory and its missing parents, inside the tree.
    pub fn create_dir_all(&self, rel: &Path, mode: u32) -> Result<()> {
        self.root
            .mkdir_all(relative(rel), &Permissions::from_mode(mode))
            .map(drop)
            .with_context(|| self.err("creating directory", rel))
    }

    /// The parent directory of `rel`, created when missing, and the last name.
    fn parent_of(&self, rel: &Path) -> Result<(PathBuf, std::ffi::OsString)> {
        let (parent, name) = split_parent(rel)?;
        if !parent.as_os_str().is_empty() {
            self.create_dir_all(&parent, 0o755)?;
        }
        Ok((parent, name))
    }

    /// Writes a whole file atomically: a new temp file beside it, then a
    /// rename over whatever `rel` was (a symlink there is replaced).
    pub fn write(&self, rel: &Path, data: &[u8], mode: u32) -> Result<()> {
        self.write_from(rel, &mut &data[..], mode)
    }

    /// Copies a host file (a trusted input such as a built kernel) into the tree.
    pub fn copy_in(&self, host_file: &Path, rel: &Path, mode: u32) -> Result<()> {
        let mut source = File::open(host_file).with_context(|| format!("opening {}", host_file.display()))?;
        self.write_from(rel, &mut source, mode)
            .with_context(|| format!("copying {}", host_file.display()))
    }

    /// Writes a whole file that must not exist yet: a synced temp file
    /// beside it, then a rename that fails if `rel` appeared meanwhile. A
    /// record written once (a first-boot outcome) is never replaced.
    pub fn write_new(&self, rel: &Path, data: &[u8], mode: u32) -> Result<()> {
        let (parent, name) = self.parent_of(rel)?;
        let temp = self.write_temp(&parent, &mut &data[..], mode, rel, true)?;
        self.root
            .rename(&temp, parent.join(name), RenameFlags::RENAME_NOREPLACE)
            .inspect_err(|_| {
                let _ = self.root.remove_file(&temp);
            })
            .with_context(|| self.err("creating (it must not exist yet)", rel))
    }

    /// Replaces a whole file so that a power cut leaves the old or the new
    /// one: a synced temp file renamed over `rel`, then the directory synced.
    pub fn write_durable(&self, rel: &Path, data: &[u8], mode: u32) -> Result<()> {
        let (parent, name) = self.parent_of(rel)?;
        let temp = self.write_temp(&parent, &mut &data[..], mode, rel, true)?;
        self.rename(&temp, &parent.join(name))?;
        let dir = self
            .root
            .resolve(&parent)
            .and_then(|handle| handle.reopen(OpenFlags::O_RDONLY | OpenFlags::O_DIRECTORY))
            .with_context(|| self.err("opening the directory of", rel))?;
        dir.sync_all()
            .with_context(|| self.err("syncing the directory of", rel))
    }

    /// Overwrites an existing regular file's bytes in place, synced: the
    /// same length, no truncation, so the file keeps its blocks (GRUB's
    /// environment block on a FAT ESP is written by GRUB the same way).
    pub fn overwrite_in_place(&self, rel: &Path, data: &[u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        // The file the write lands on, links followed, is the one unshared.
        let rel = &self.resolved(rel)?;
        self.break_hardlink(rel)?;
        let file = self
            .root
            .resolve(relative(rel))
            .and_then(|handle| handle.reopen(OpenFlags::O_WRONLY | OpenFlags::O_CLOEXEC))
            .with_context(|| self.err("opening for writing", rel))?;
        let meta = file.metadata().with_context(|| self.err("reading", rel))?;
        if !meta.is_file() || meta.len() != data.len() as u64 {
            bail!(
                "{}: expected a regular file of {} bytes",
                self.err("overwriting", rel),
                data.len()
            );
        }
        file.write_all_at(data, 0)
            .and_then(|_| file.sync_all())
            .with_context(|| self.err("overwriting", rel))
    }

    fn write_from(&self, rel: &Path, source: &mut dyn Read, mode: u32) -> Result<()> {
        let (parent, name) = self.parent_of(rel)?;
        let temp = self.write_temp(&parent, source, mode, rel, false)?;
        self.rename(&temp, &parent.join(name))
    }

    /// A new file in `parent` holding `source` (synced to disk when `sync`);
    /// returns its path.
    fn write_temp(
        &self,
        parent: &Path,
        source: &mut dyn Read,
        mode: u32,
        rel: &Path,
        sync: bool,
    ) -> Result<PathBuf> {
        let temp = parent.join(temp_name());
        let flags = OpenFlags::O_WRONLY | OpenFlags::O_EXCL | OpenFlags::O_CLOEXEC;
        let mut file = self
            .root
            .create_file(&temp, flags, &Permissions::from_mode(0o600))
            .with_context(|| self.err("creating", &temp))?;
        let written = std::io::copy(source, &mut file)
            .map_err(anyhow::Error::from)
            .and_then(|_| Ok(file.set_permissions(Permissions::from_mode(mode))?))
            .and_then(|_| Ok(file.flush()?))
            .and_then(|_| if sync { Ok(file.sync_all()?) } else { Ok(()) });
        if let Err(e) = written {
            let _ = self.root.remove_file(&temp);
            return Err(e.context(self.err("writing", rel)));
        }
        Ok(temp)
    }

    /// Creates (replacing whatever is there) a symlink at `rel` pointing to `target`.
    pub fn symlink(&self, rel: &Path, target: &Path) -> Result<()> {
        let (parent, name) = self.parent_of(rel)?;
        let link = parent.join(name);
        self.remove(&link)?;
        self.root
            .create(&link, &InodeType::Symlink(target.to_path_buf()))
            .with_context(|| self.err("creating symlink", rel))
    }

    /// Removes whatever is at `rel` (file, symlink or whole directory), never
    /// following the last component. A missing path is not an error.
    pub fn remove(&self, rel: &Path) -> Result<()> {
        let rel = relative(rel);
        if rel.as_os_str().is_empty() {
            bail!("refusing to remove the root of {}", self.path.display());
        }
        match self.symlink_metadata(&rel)? {
            None => Ok(()),
            Some(meta) if meta.is_dir() => self.root.remove_all(&rel),
            Some(_) => self.root.remove_file(&rel),
        }
        .with_context(|| self.err("removing", &rel))
    }

    /// Renames inside the tree; replaces a file or empty directory at `to`,
    /// whose parent is created when missing.
    pub fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.parent_of(to)?;
        self.root
            .rename(relative(from), relative(to), RenameFlags::empty())
            .with_context(|| format!("{} to /{}", self.err("moving", from), relative(to).display()))
    }

    /// The metadata of `rel` itself (a symlink is not followed), or None.
    pub fn symlink_metadata(&self, rel: &Path) -> Result<Option<Metadata>> {
        let rel = relative(rel);
        match self.root.resolve_nofollow(&rel) {
            Ok(handle) => {
                let file = File::from(OwnedFd::from(handle));
                Ok(Some(
                    file.metadata()
                        .with_context(|| self.err("reading metadata of", &rel))?,
                ))
            }
            Err(e) if is_missing(e.kind()) => Ok(None),
            Err(e) => Err(e).with_context(|| self.err("resolving", &rel)),
        }
    }

    /// True when `rel` resolves (following links inside the tree) to a directory.
    pub fn is_dir(&self, rel: &Path) -> bool {
        self.root
            .resolve(relative(rel))
            .and_then(|h| h.reopen(OpenFlags::O_PATH))
            .map(|f| f.metadata().is_ok_and(|m| m.is_dir()))
            .unwrap_or(false)
    }

    /// True when `rel` resolves (following links inside the tree) to a regular file.
    pub fn is_file(&self, rel: &Path) -> bool {
        self.open_file(rel)
            .and_then(|f| Ok(f.metadata()?.is_file()))
            .unwrap_or(false)
    }

    /// Opens `rel` for reading, resolved inside the tree.
    pub fn open_file(&self, rel: &Path) -> Result<File> {
        self.root
            .open_subpath(relative(rel), OpenFlags::O_RDONLY | OpenFlags::O_CLOEXEC)
            .with_context(|| self.err("opening", rel))
    }

    pub fn read(&self, rel: &Path) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        self.open_file(rel)?
            .read_to_end(&mut bytes)
            .with_context(|| self.err("reading", rel))?;
        Ok(bytes)
    }

    pub fn read_link(&self, rel: &Path) -> Result<PathBuf> {
        self.root
            .readlink(relative(rel))
            .with_context(|| self.err("reading symlink", rel))
    }

    /// The host path of the directory `rel` resolves to, checked to be inside
    /// the tree. For walks that read (walkdir does not follow links).
    pub fn real_dir(&self, rel: &Path) -> Result<PathBuf> {
        if !self.is_dir(rel) {
            bail!("{} is not a directory", self.err("path", rel));
        }
        self.real_dir_or_file(rel)
    }

    fn real_dir_or_file(&self, rel: &Path) -> Result<PathBuf> {
        let handle = self
            .root
            .resolve(relative(rel))
            .with_context(|| self.err("resolving", rel))?;
        let real = std::fs::read_link(format!("/proc/self/fd/{}", handle.as_fd().as_raw_fd()))
            .with_context(|| self.err("locating", rel))?;
        let top = std::fs::canonicalize(&self.path)?;
        if !real.starts_with(&top) {
            bail!("{} resolves outside the tree", self.err("directory", rel));
        }
        Ok(real)
    }

    /// The tree-relative path `rel` resolves to, links inside the tree followed.
    pub fn resolved(&self, rel: &Path) -> Result<PathBuf> {
        let real = self.real_dir_or_file(rel)?;
        let top = std::fs::canonicalize(&self.path)?;
        Ok(real.strip_prefix(&top).expect("checked inside").to_path_buf())
    }

    /// The tree-relative path `rel` names once the symlinks along it are
    /// followed, the way the target will see it (absolute links re-rooted,
    /// `..` stopped at the root), as far as it exists; the missing rest is
    /// appended as given. For a path that crosses a link into a directory
    /// not created yet (`/root` -> `var/roothome` on a fresh deployment).
    pub fn resolved_partial(&self, rel: &Path) -> Result<PathBuf> {
        const MAX_LINKS: usize = 40;
        let mut done = PathBuf::new();
        let mut todo: std::collections::VecDeque<std::ffi::OsString> =
            relative(rel).iter().map(ToOwned::to_owned).collect();
        let mut links = 0;
        while let Some(part) = todo.pop_front() {
            if part == ".." {
                done.pop();
                continue;
            }
            let candidate = done.join(&part);
            let is_link = self
                .symlink_metadata(&candidate)?
                .is_some_and(|m| m.file_type().is_symlink());
            if !is_link {
                done = candidate;
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                bail!(
                    "{}: too many levels of symbolic links",
                    self.err("resolving", rel)
                );
            }
            let target = self.read_link(&candidate)?;
            if target.is_absolute() {
                done = PathBuf::new();
            }
            for component in relative(&target).iter().rev() {
                todo.push_front(component.to_owned());
            }
        }
        Ok(done)
    }

    /// Gives `rel` an inode of its own when it shares one (a hardlink
    /// checkout shares every file with an object of the build repo): a copy
    /// with the same bytes, target, mode and owner is renamed over it. Every
    /// write that changes an existing inode calls this first, so nothing
    /// done to the tree reaches another name of the file.
    pub fn break_hardlink(&self, rel: &Path) -> Result<()> {
        let Some(meta) = self.symlink_metadata(rel)? else {
            return Ok(());
        };
        if meta.nlink() < 2 || meta.is_dir() {
            return Ok(());
        }
        let (parent, _) = split_parent(rel)?;
        let temp = if meta.file_type().is_symlink() {
            let temp = parent.join(temp_name());
            self.root
                .create(&temp, &InodeType::Symlink(self.read_link(rel)?))
                .with_context(|| self.err("copying symlink", rel))?;
            temp
        } else {
            let mut source = self.open_regular_nofollow(rel)?;
            self.write_temp(&parent, &mut source, meta.mode() & 0o7777, rel, false)?
        };
        self.set_attr(&temp, meta.mode() & 0o7777, meta.uid(), meta.gid())
            .and_then(|()| self.rename(&temp, &relative(rel)))
            .inspect_err(|_| {
                let _ = self.root.remove_file(&temp);
            })
            .with_context(|| self.err("breaking the hardlink of", rel))
    }

    /// Opens the regular file `rel` itself for reading (a symlink at the
    /// last component is not followed).
    fn open_regular_nofollow(&self, rel: &Path) -> Result<File> {
        self.root
            .resolve_nofollow(relative(rel))
            .and_then(|handle| handle.reopen(OpenFlags::O_RDONLY | OpenFlags::O_CLOEXEC))
            .with_context(|| self.err("opening", rel))
    }

    /// Sets the owner and, unless it is a symlink, the mode of `rel` itself
    /// (a hardlink is broken first; nothing is done when both already hold).
    pub fn set_attr(&self, rel: &Path, mode: u32, uid: u32, gid: u32) -> Result<()> {
        let current = self
            .symlink_metadata(rel)?
            .with_context(|| self.err("no such path:", rel))?;
        let is_link = current.file_type().is_symlink();
        let mode_holds = is_link || current.mode() & 0o7777 == mode;
        if mode_holds && current.uid() == uid && current.gid() == gid {
            return Ok(());
        }
        self.break_hardlink(rel)?;
        let handle = self
            .root
            .resolve_nofollow(relative(rel))
            .with_context(|| self.err("resolving", rel))?;
        let fd = handle.as_fd().as_raw_fd();
        // SAFETY: fd is a valid O_PATH descriptor owned by `handle`; the path is a
        // NUL-terminated empty string, as AT_EMPTY_PATH requires.
        let rc = unsafe { libc::fchownat(fd, c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| self.err("setting the owner of", rel));
        }
        if !is_link {
            // chmod through the already-resolved descriptor: no path lookup again.
            std::fs::set_permissions(format!("/proc/self/fd/{fd}"), Permissions::from_mode(mode))
                .with_context(|| self.err("setting the mode of", rel))?;
        }
        Ok(())
    }

    /// Sets the mode of `rel` (which must not be a symlink).
    pub fn set_mode(&self, rel: &Path, mode: u32) -> Result<()> {
        let meta = self
            .symlink_metadata(rel)?
            .with_context(|| self.err("no such path:", rel))?;
        self.set_attr(rel, mode, meta.uid(), meta.gid())
    }

    /// Makes `rel` an empty directory with `mode`, whatever was there.
    pub fn empty_dir(&self, rel: &Path, mode: u32) -> Result<()> {
        if self.symlink_metadata(rel)?.is_some_and(|m| m.is_dir()) {
            for entry in self.list(rel)? {
                self.remove(&rel.join(entry))?;
            }
        } else {
            self.remove(rel)?;
            self.create_dir_all(rel, mode)?;
        }
        self.set_mode(rel, mode)
    }

    /// The names in directory `rel`, sorted.
    pub fn list(&self, rel: &Path) -> Result<Vec<std::ffi::OsString>> {
        let dir = self.real_dir(rel)?;
        let mut names = std::fs::read_dir(&dir)
            .with_context(|| self.err("listing", rel))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<Vec<_>>>()?;
        names.sort();
        Ok(names)
    }

    /// Copies a trusted host directory (kernel modules, an overlay) into the
    /// tree at `rel`, keeping modes, numeric owners and symlinks as symlinks.
    /// Existing directories are merged into; files and links are replaced.
    pub fn copy_tree_in(&self, host_dir: &Path, rel: &Path) -> Result<Copied> {
        let mut copied = Copied::default();
        for entry in walkdir::WalkDir::new(host_dir).sort_by_file_name() {
            let entry = entry.with_context(|| format!("walking {}", host_dir.display()))?;
            let dest = rel.join(entry.path().strip_prefix(host_dir).expect("inside"));
            let meta = entry.path().symlink_metadata()?;
            self.copy_entry_in(entry.path(), &meta, &dest)?;
            match meta.file_type() {
                t if t.is_symlink() => copied.symlinks += 1,
                t if t.is_dir() => copied.dirs += 1,
                _ => copied.files += 1,
            }
        }
        Ok(copied)
    }

    /// Copies one host entry (file, directory or symlink) to `dest`, with its
    /// mode and numeric owner.
    pub fn copy_entry_in(&self, source: &Path, meta: &Metadata, dest: &Path) -> Result<()> {
        let file_type = meta.file_type();
        if file_type.is_symlink() {
            self.symlink(dest, &std::fs::read_link(source)?)?;
        } else if file_type.is_dir() {
            if !self.symlink_metadata(dest)?.is_some_and(|m| m.is_dir()) {
                self.remove(dest)?;
                self.create_dir_all(dest, meta.mode() & 0o7777)?;
            }
        } else if file_type.is_file() {
            self.copy_in(source, dest, meta.mode() & 0o7777)?;
        } else {
            bail!(
                "{}: only files, directories and symlinks can be copied into an image",
                source.display()
            );
        }
        if relative(dest).as_os_str().is_empty() {
            return Ok(());
        }
        self.set_attr(dest, meta.mode() & 0o7777, meta.uid(), meta.gid())
    }

    /// Moves the contents of directory `from` into directory `to` (created
    /// when missing), merging directories that exist on both sides.
    pub fn move_contents(&self, from: &Path, to: &Path) -> Result<()> {
        self.create_dir_all(to, 0o755)?;
        for name in self.list(from)? {
            let (source, dest) = (from.join(&name), to.join(&name));
            let both_dirs = self.symlink_metadata(&source)?.is_some_and(|m| m.is_dir())
                && self.symlink_metadata(&dest)?.is_some_and(|m| m.is_dir());
            if both_dirs {
                self.move_contents(&source, &dest)?;
                self.remove(&source)?;
            } else {
                self.remove(&dest)?;
                self.rename(&source, &dest)?;
            }
        }
        Ok(())
    }

    /// Bytes and number of the regular files in the tree.
    pub fn size(&self) -> Result<(u64, u64)> {
        tree_size(&self.path)
    }
}

fn is_missing(kind: pathrs::error::ErrorKind) -> bool {
    use pathrs::error::ErrorKind;
    matches!(kind, ErrorKind::OsError(Some(libc::ENOENT | libc::ENOTDIR)))
}

/// A name for a temp file beside the one it replaces.
fn temp_name() -> String {
    format!(".imgbuild-{}-{}", std::process::id(), unique())
}

/// A process-unique counter for temp names.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A tree whose links all point out of it, and a host dir they aim at.
    fn hostile() -> (tempfile::TempDir, tempfile::TempDir, ImageRoot) {
        let host = tempfile::tempdir().unwrap();
        let tree = tempfile::tempdir().unwrap();
        let h = host.path();
        std::fs::write(h.join("precious"), "host file\n").unwrap();
        symlink(h, tree.path().join("abs")).unwrap();
        symlink("../../../../../../../../..", tree.path().join("up")).unwrap();
        symlink(h.join("precious"), tree.path().join("file-link")).unwrap();
        let root = ImageRoot::open(tree.path()).unwrap();
        (host, tree, root)
    }

    fn host_untouched(host: &Path) {
        let names: Vec<_> = std::fs::read_dir(host)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("precious")],
            "host dir changed"
        );
        assert_eq!(
            std::fs::read_to_string(host.join("precious")).unwrap(),
            "host file\n"
        );
    }

    #[test]
    fn writes_through_absolute_links_stay_in_the_tree() {
        let (host, tree, root) = hostile();
        // While `abs` dangles inside the tree, writing through it is refused.
        assert!(root.write(Path::new("abs/new"), b"x", 0o644).is_err());
        host_untouched(host.path());
        std::fs::create_dir_all(tree.path().join(relative(host.path()))).unwrap();
        root.write(Path::new("abs/new"), b"x", 0o644).unwrap();
        host_untouched(host.path());
        // The absolute link was re-rooted: `abs` -> `<tree><host path>`.
        let rerooted = tree.path().join(relative(host.path())).join("new");
        assert_eq!(std::fs::read(rerooted).unwrap(), b"x");
    }

    #[test]
    fn dotdot_stops_at_the_root() {
        let (host, tree, root) = hostile();
        root.write(Path::new("up/etc/x"), b"y", 0o600).unwrap();
        root.write(Path::new("../../../../escape"), b"z", 0o600).unwrap();
        host_untouched(host.path());
        assert_eq!(std::fs::read(tree.path().join("etc/x")).unwrap(), b"y");
        assert_eq!(std::fs::read(tree.path().join("escape")).unwrap(), b"z");
        let mode = std::fs::metadata(tree.path().join("etc/x")).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_link_at_the_last_component_is_replaced_not_followed() {
        let (host, tree, root) = hostile();
        root.write(Path::new("/file-link"), b"image\n", 0o644).unwrap();
        host_untouched(host.path());
        let meta = std::fs::symlink_metadata(tree.path().join("file-link")).unwrap();
        assert!(meta.is_file());
    }

    #[test]
    fn removes_and_renames_never_follow_links_out() {
        let (host, tree, root) = hostile();
        root.remove(Path::new("abs")).unwrap();
        root.remove(Path::new("up/precious")).unwrap();
        std::fs::create_dir(tree.path().join("var")).unwrap();
        symlink(host.path(), tree.path().join("var/link")).unwrap();
        root.move_contents(Path::new("var"), Path::new("usr/share/factory/var"))
            .unwrap();
        host_untouched(host.path());
        let moved = tree.path().join("usr/share/factory/var/link");
        assert!(std::fs::symlink_metadata(moved).unwrap().file_type().is_symlink());
        assert!(root.remove(Path::new("/")).is_err());
    }

    #[test]
    fn attrs_and_symlinks() {
        let (host, tree, root) = hostile();
        root.set_attr(Path::new("file-link"), 0o600, 0, 0).unwrap();
        assert_eq!(
            std::fs::metadata(host.path().join("precious")).unwrap().mode() & 0o777,
            0o644
        );
        root.symlink(Path::new("abs"), Path::new("usr/lib")).unwrap();
        assert_eq!(
            std::fs::read_link(tree.path().join("abs")).unwrap(),
            PathBuf::from("usr/lib")
        );
        root.create_dir_all(Path::new("d/e"), 0o750).unwrap();
        root.set_mode(Path::new("d/e"), 0o700).unwrap();
        assert!(root.is_dir(Path::new("d/e")));
        assert!(!root.is_file(Path::new("d/e")));
        host_untouched(host.path());
    }

    /// What a hardlink checkout looks like: every name in the tree shares
    /// its inode with an object outside it. Changing bytes, mode or owner
    /// through the tree must leave the other name as it was.
    #[test]
    fn writes_break_hardlinks_and_leave_the_other_name_intact() {
        let objects = tempfile::tempdir().unwrap();
        let tree = tempfile::tempdir().unwrap();
        let root = ImageRoot::open(tree.path()).unwrap();
        let link_in = |name: &str, data: &str, mode: u32| {
            let object = objects.path().join(name);
            std::fs::write(&object, data).unwrap();
            std::fs::set_permissions(&object, Permissions::from_mode(mode)).unwrap();
            std::fs::hard_link(&object, tree.path().join(name)).unwrap();
            object
        };
        let chmodded = link_in("chmodded", "a\n", 0o644);
        let rewritten = link_in("rewritten", "bbbb", 0o644);
        let replaced = link_in("replaced", "c\n", 0o644);
        let same = link_in("same", "d\n", 0o644);
        std::os::unix::fs::symlink("target", objects.path().join("link")).unwrap();
        std::fs::hard_link(objects.path().join("link"), tree.path().join("link")).unwrap();

        root.set_mode(Path::new("chmodded"), 0o4755).unwrap();
        root.overwrite_in_place(Path::new("rewritten"), b"BBBB").unwrap();
        root.write(Path::new("replaced"), b"C\n", 0o600).unwrap();
        root.set_mode(Path::new("same"), 0o644).unwrap();
        root.set_attr(Path::new("link"), 0, 0, 1).unwrap();

        let meta = |p: &Path| std::fs::symlink_metadata(p).unwrap();
        assert_eq!(meta(&chmodded).mode() & 0o7777, 0o644);
        assert_eq!(meta(&tree.path().join("chmodded")).mode() & 0o7777, 0o4755);
        assert_eq!(std::fs::read(tree.path().join("chmodded")).unwrap(), b"a\n");
        assert_eq!(std::fs::read(&rewritten).unwrap(), b"bbbb");
        assert_eq!(std::fs::read(tree.path().join("rewritten")).unwrap(), b"BBBB");
        assert_eq!(std::fs::read(&replaced).unwrap(), b"c\n");
        assert_eq!(meta(&replaced).mode() & 0o7777, 0o644);
        for (object, name) in [
            (&chmodded, "chmodded"),
            (&rewritten, "rewritten"),
            (&replaced, "replaced"),
        ] {
            assert_eq!(meta(object).nlink(), 1, "{name} still shares its inode");
        }
        // Nothing to change: the link is kept (no needless copy).
        assert_eq!(meta(&same).nlink(), 2);
        let object_link = meta(&objects.path().join("link"));
        assert_eq!((object_link.nlink(), object_link.gid()), (1, 0));
        assert_eq!(meta(&tree.path().join("link")).gid(), 1);
        assert_eq!(
            std::fs::read_link(tree.path().join("link")).unwrap(),
            PathBuf::from("target")
        );
    }

    #[test]
    fn reads_resolve_inside_the_tree() {
        let (_host, tree, root) = hostile();
        std::fs::write(tree.path().join("inside"), "in").unwrap();
        symlink("/inside", tree.path().join("abs-inside")).unwrap();
        assert_eq!(root.read(Path::new("abs-inside")).unwrap(), b"in");
        // `file-link` points at the host's file; inside the tree it dangles.
        assert!(root.read(Path::new("file-link")).is_err());
        assert!(
            root.real_dir(Path::new("abs")).is_err() || {
                let d = root.real_dir(Path::new("abs")).unwrap();
                d.starts_with(std::fs::canonicalize(tree.path()).unwrap())
            }
        );
    }

    #[test]
    fn write_new_never_replaces() {
        let (host, tree, root) = hostile();
        root.write_new(Path::new("var/lib/record.json"), b"first\n", 0o644)
            .unwrap();
        let err = root
            .write_new(Path::new("var/lib/record.json"), b"second\n", 0o644)
            .unwrap_err();
        assert!(format!("{err:#}").contains("must not exist yet"), "{err:#}");
        let record = tree.path().join("var/lib/record.json");
        assert_eq!(std::fs::read_to_string(&record).unwrap(), "first\n");
        // No temp file is left beside it, and a link there is not written through.
        assert_eq!(std::fs::read_dir(record.parent().unwrap()).unwrap().count(), 1);
        assert!(root.write_new(Path::new("file-link"), b"x", 0o644).is_err());
        host_untouched(host.path());
    }

    #[test]
    fn partial_resolution_follows_links_inside_the_tree() {
        let (host, tree, root) = hostile();
        symlink("var/roothome", tree.path().join("root")).unwrap();
        std::fs::create_dir(tree.path().join("var")).unwrap();
        symlink("/etc", tree.path().join("var/etc-link")).unwrap();
        let resolved = |p: &str| root.resolved_partial(Path::new(p)).unwrap();
        assert_eq!(resolved("/root/.ssh"), PathBuf::from("var/roothome/.ssh"));
        assert_eq!(resolved("/var/etc-link/x"), PathBuf::from("etc/x"));
        assert_eq!(
            resolved("/abs/x"),
            host.path().strip_prefix("/").unwrap().join("x")
        );
        assert_eq!(resolved("/up/etc"), PathBuf::from("etc"));
        assert_eq!(resolved("/../../a/./b"), PathBuf::from("a/b"));
        symlink("loop", tree.path().join("loop")).unwrap();
        assert!(root.resolved_partial(Path::new("loop/x")).is_err());
    }

    #[test]
    fn copies_trees_in_with_links_kept() {
        let (host, tree, root) = hostile();
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("kernel/drivers")).unwrap();
        std::fs::write(src.path().join("kernel/drivers/a.ko"), "ko").unwrap();
        symlink("/nonexistent", src.path().join("build")).unwrap();
        std::fs::create_dir_all(tree.path().join(relative(host.path()))).unwrap();
        let copied = root.copy_tree_in(src.path(), Path::new("abs/modules")).unwrap();
        assert_eq!(copied.files, 1);
        assert_eq!(copied.symlinks, 1);
        host_untouched(host.path());
        let base = tree.path().join(relative(host.path())).join("modules");
        assert_eq!(std::fs::read(base.join("kernel/drivers/a.ko")).unwrap(), b"ko");
        assert_eq!(root.size().unwrap().1, 1);
    }

    /// Measures the cost of confinement: copying a real tree (the host's
    /// /usr/share/doc, or $ROOT_BENCH_DIR) into a tree through ImageRoot
    /// against plain std::fs copies, in one run. Prints the ratio.
    /// `cargo test --release -p imgbuild --lib io::root::tests::bench -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement, not a check"]
    fn bench_confined_copy_against_plain_copy() {
        let source = std::env::var("ROOT_BENCH_DIR").unwrap_or_else(|_| "/usr/share/doc".into());
        let source = Path::new(&source);
        let plain_copy = |to: &Path| {
            for entry in walkdir::WalkDir::new(source).sort_by_file_name() {
                let entry = entry.unwrap();
                let dest = to.join(entry.path().strip_prefix(source).unwrap());
                let meta = entry.path().symlink_metadata().unwrap();
                if meta.file_type().is_symlink() {
                    symlink(std::fs::read_link(entry.path()).unwrap(), &dest).unwrap();
                } else if meta.is_dir() {
                    std::fs::create_dir_all(&dest).unwrap();
                } else {
                    std::fs::copy(entry.path(), &dest).unwrap();
                }
            }
        };
        let (mut plain, mut confined) = (Vec::new(), Vec::new());
        let mut files = 0;
        for _ in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let started = std::time::Instant::now();
            plain_copy(&dir.path().join("plain"));
            plain.push(started.elapsed().as_secs_f64());
            let root = ImageRoot::create(&dir.path().join("confined")).unwrap();
            let started = std::time::Instant::now();
            files = root.copy_tree_in(source, Path::new("x")).unwrap().files;
            confined.push(started.elapsed().as_secs_f64());
        }
        let best = |v: &[f64]| v.iter().cloned().fold(f64::MAX, f64::min);
        eprintln!(
            "{files} files from {}: plain {:.3} s, confined {:.3} s (best of 3 each, interleaved), ratio {:.2}",
            source.display(),
            best(&plain),
            best(&confined),
            best(&confined) / best(&plain)
        );
    }
}
