//! How files reach a remote (an ostree repo for `publish`, an artifact
//! cache for `cache push`): [`LocalDir`] for a directory or `file://`,
//! [`ssh::SshDir`] for `ssh://user@host[:port]/path`. Every file goes to a
//! temp name and is renamed into place, so a reader sees it whole or not at
//! all.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::io::records;
use crate::ostree as ost;

pub mod ssh;

/// The prefix of every temp file and dir publish makes at the destination.
/// Nothing else there starts with it, so whatever carries it when a publish
/// starts (under the destination's lock) was left by a killed run.
pub const TEMP_PREFIX: &str = ".publish-";

/// The lock file that keeps two publishes to one destination apart.
pub const LOCK_FILE: &str = ".publish.lock";

/// How files reach the remote. Writes may be queued: [`Transport::flush`]
/// makes every earlier write visible, and callers flush at the end of each
/// phase that must be complete before the next one starts.
pub trait Transport {
    fn describe(&self) -> String;
    /// Makes DEST an archive repo if it is not one yet.
    fn ensure_repo(&self) -> Result<()>;
    /// Makes DEST a directory if it is not one yet (a remote cache).
    fn ensure_root(&self) -> Result<()>;
    /// Holds the destination for one publish; released when dropped.
    fn lock(&self) -> Result<Box<dyn std::any::Any>>;
    /// Removes the temp files and dirs ([`TEMP_PREFIX`]) a killed publish
    /// left behind; returns how many. Call it only while holding the lock.
    fn remove_stale_temps(&self) -> Result<usize>;
    fn exists(&self, rel: &Path) -> Result<bool>;
    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>>;
    /// Writes `data` to `rel` atomically (temp name, then rename).
    fn put(&self, rel: &Path, data: &[u8]) -> Result<()>;
    /// Copies a local file to `rel` atomically; it may be queued until
    /// [`Transport::flush`].
    fn put_file(&self, rel: &Path, source: &Path) -> Result<()>;
    /// Makes every queued write visible at the remote.
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    /// Removes `rel` if it exists.
    fn remove(&self, rel: &Path) -> Result<()>;
    /// The summary the remote's refs, commits and deltas call for, generated
    /// without touching the summary it serves.
    fn generate_summary(&self) -> Result<Vec<u8>>;
}

/// The transport `dest` names: `ssh://user@host[:port]/path`, else a
/// directory path or `file://`.
pub fn open(dest: &str) -> Result<Box<dyn Transport>> {
    if dest.starts_with("ssh://") {
        return Ok(Box::new(ssh::SshDir::parse(dest)?));
    }
    Ok(Box::new(LocalDir::parse(dest)?))
}

/// A remote that is a directory on this machine (a web root).
pub struct LocalDir {
    pub root: PathBuf,
}

impl LocalDir {
    /// Accepts a path or a `file://` URL.
    pub fn parse(dest: &str) -> Result<LocalDir> {
        if let Some(path) = dest.strip_prefix("file://") {
            return Ok(LocalDir {
                root: PathBuf::from(path),
            });
        }
        if dest.contains("://") {
            bail!("unsupported destination {dest:?}: use a directory path, file:// or ssh://");
        }
        Ok(LocalDir {
            root: PathBuf::from(dest),
        })
    }

    /// Writes `rel` from `reader` through the temp file's own descriptor
    /// (never by its name, which another user of the web root could swap),
    /// readable by the web server (0644), then renames it into place. On any
    /// error the temp file is dropped, which removes it.
    fn put_from(&self, rel: &Path, reader: &mut dyn std::io::Read, what: &str) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mut temp = self.temp_in(rel)?;
        std::io::copy(reader, temp.as_file_mut()).with_context(|| format!("copying {what}"))?;
        temp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
        temp.as_file().sync_all()?;
        temp.persist(self.root.join(rel))
            .with_context(|| format!("writing {}", rel.display()))?;
        Ok(())
    }

    /// A temp file in the directory of `rel`, which is made when missing.
    /// The web root may hold planted links (`qualifications -> /etc`): every
    /// directory on the way must be a real one, never a symlink, so a write
    /// cannot land outside it.
    fn temp_in(&self, rel: &Path) -> Result<tempfile::NamedTempFile> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        let root = emberrtos_contract::io::root::ImageRoot::open(&self.root)?;
        records::real_dirs(&root, parent, true)?;
        let dir = self.root.join(parent);
        tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&dir)
            .with_context(|| format!("creating a temp file in {}", dir.display()))
    }
}

/// Whether a directory entry is one of publish's temp files or dirs.
fn is_publish_temp(entry: &walkdir::DirEntry) -> bool {
    entry.depth() > 0 && entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX)
}

impl Transport for LocalDir {
    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }

    fn ensure_repo(&self) -> Result<()> {
        if !self.root.join("config").is_file() {
            ost::open_or_create(&self.root)?;
        }
        Ok(())
    }

    fn ensure_root(&self) -> Result<()> {
        std::fs::create_dir_all(&self.root).with_context(|| format!("creating {}", self.root.display()))
    }

    fn lock(&self) -> Result<Box<dyn std::any::Any>> {
        let path = self.root.join(LOCK_FILE);
        use std::os::unix::fs::OpenOptionsExt;
        // A link or FIFO planted at the name is refused, not followed.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
        Ok(Box::new(file))
    }

    fn remove_stale_temps(&self) -> Result<usize> {
        let mut stale = Vec::new();
        let mut walk = walkdir::WalkDir::new(&self.root).into_iter();
        while let Some(entry) = walk.next() {
            let entry = entry.with_context(|| format!("listing {}", self.root.display()))?;
            if is_publish_temp(&entry) {
                if entry.file_type().is_dir() {
                    walk.skip_current_dir();
                }
                stale.push(entry);
            }
        }
        for entry in &stale {
            let result = if entry.file_type().is_dir() {
                std::fs::remove_dir_all(entry.path())
            } else {
                std::fs::remove_file(entry.path())
            };
            result.with_context(|| format!("removing stale {}", entry.path().display()))?;
        }
        Ok(stale.len())
    }

    fn exists(&self, rel: &Path) -> Result<bool> {
        Ok(self.root.join(rel).exists())
    }

    /// Never through a link planted at the name (an error), and a FIFO
    /// there cannot hang the read.
    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>> {
        use std::io::Read;
        let path = self.root.join(rel);
        let file = match crate::io::open_nofollow(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        if !file.metadata()?.is_file() {
            bail!("{} is not a regular file", path.display());
        }
        // What publish reads back is small (refs, summaries, metadata,
        // records): a planted huge file is refused, not read into memory.
        const READ_LIMIT: u64 = 64 << 20;
        let mut data = Vec::new();
        file.take(READ_LIMIT + 1)
            .read_to_end(&mut data)
            .with_context(|| format!("reading {}", path.display()))?;
        if data.len() as u64 > READ_LIMIT {
            bail!("{} is larger than {READ_LIMIT} bytes", path.display());
        }
        Ok(Some(data))
    }

    fn put(&self, rel: &Path, data: &[u8]) -> Result<()> {
        self.put_from(rel, &mut &data[..], "the data")
    }

    fn put_file(&self, rel: &Path, source: &Path) -> Result<()> {
        let mut file =
            std::fs::File::open(source).with_context(|| format!("opening {}", source.display()))?;
        self.put_from(rel, &mut file, &source.display().to_string())
    }

    fn remove(&self, rel: &Path) -> Result<()> {
        match std::fs::remove_file(self.root.join(rel)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", self.root.join(rel).display()))
            }
            _ => Ok(()),
        }
    }

    fn generate_summary(&self) -> Result<Vec<u8>> {
        let scratch = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempdir_in(&self.root)
            .with_context(|| format!("creating a scratch dir in {}", self.root.display()))?;
        ost::generate_summary(&self.root, scratch.path())
    }
}
