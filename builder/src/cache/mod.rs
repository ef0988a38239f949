//! The content-addressed cache (`$IMGBUILD_CACHE`, default `~/.cache/imgbuild`).
//!
//! Layout:
//! - `blobs/sha256/<hex>`: downloaded or imported files, named by their content;
//! - `sources/<hex>/`: pristine extracted source trees, by tarball hash;
//! - `<area>/<key>/`: stage artifacts by cache key (kernels, rootfs, ...);
//! - `index/`: small JSON memos (hash of a local file by path + size + mtime,
//!   size of a blob when it was stored);
//! - `tmp/`: temp files; everything is written here and renamed into place.
//!
//! Entries are never trusted blindly: a blob's size is checked against the
//! size recorded when it was stored before every use, and its hash when that
//! is cheap or when the file changed since it was last hashed. Inserts are
//! race-safe: the loser of a rename race checks the winner's entry and uses it.

use std::fs::{self, File};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::io::atomic::write_atomic;
use crate::io::hashing::{sha256_file, sha256_hex};

pub mod admin;
pub mod download;
pub mod remote;

/// Blobs up to this size are re-hashed before every use; larger ones when
/// their stat memo no longer matches.
pub const REHASH_BLOBS_UP_TO: u64 = 64 << 20;

#[derive(Clone, Debug)]
pub struct Cache {
    root: PathBuf,
    rehash_up_to: u64,
    /// Where stages look for an artifact before building it.
    remote: Option<remote::RemoteCache>,
}

/// What [`Cache::lookup_blob`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlobLookup {
    /// A present entry that passed its checks.
    Hit(PathBuf),
    Missing,
    /// The entry was damaged and has been removed; says how it was damaged.
    Removed(String),
}

/// How hard [`Cache::lookup_blob_with`] checks an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobCheck {
    /// The size always; the hash for small blobs and changed files.
    WhenCheap,
    /// The size and the hash.
    Always,
}

/// What the cache remembers about a stored blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct BlobMemo {
    /// The size that was hashed when the blob was stored.
    size: u64,
    /// The file as it was when its hash last matched.
    stamp: FileStamp,
}

impl Cache {
    /// `$IMGBUILD_CACHE`, else `$XDG_CACHE_HOME/imgbuild`, else `~/.cache/imgbuild`.
    pub fn default_root() -> PathBuf {
        if let Some(dir) = std::env::var_os("IMGBUILD_CACHE").filter(|d| !d.is_empty()) {
            return PathBuf::from(dir);
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(dir).join("imgbuild");
        }
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
        home.join(".cache/imgbuild")
    }

    pub fn open(root: &Path) -> Result<Cache> {
        for sub in ["blobs/sha256", "tmp", "index"] {
            let dir = root.join(sub);
            fs::create_dir_all(&dir)
                .with_context(|| format!("creating cache directory {}", dir.display()))?;
        }
        let root = root
            .canonicalize()
            .with_context(|| format!("resolving cache directory {}", root.display()))?;
        Ok(Cache {
            root,
            rehash_up_to: REHASH_BLOBS_UP_TO,
            remote: None,
        })
    }

    /// Stages look artifacts up on `remote` before building them.
    pub fn with_remote(mut self, remote: Option<remote::RemoteCache>) -> Cache {
        self.remote = remote;
        self
    }

    pub fn remote(&self) -> Option<&remote::RemoteCache> {
        self.remote.as_ref()
    }

    /// Sets the size up to which blobs are re-hashed before every use.
    pub fn with_rehash_limit(mut self, bytes: u64) -> Cache {
        self.rehash_up_to = bytes;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn blob_path(&self, sha256: &str) -> PathBuf {
        self.root.join("blobs/sha256").join(sha256)
    }

    /// The blob named `sha256`, checked [`BlobCheck::WhenCheap`].
    pub fn lookup_blob(&self, sha256: &str) -> Result<BlobLookup> {
        self.lookup_blob_with(sha256, BlobCheck::WhenCheap)
    }

    /// The blob named `sha256` if it passes `check`; a damaged one is removed.
    pub fn lookup_blob_with(&self, sha256: &str, check: BlobCheck) -> Result<BlobLookup> {
        let path = self.blob_path(sha256);
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BlobLookup::Missing),
            Err(e) => return Err(e).with_context(|| format!("reading metadata of {}", path.display())),
            Ok(_) => {}
        }
        match self.blob_damage(sha256, &path, check)? {
            None => Ok(BlobLookup::Hit(path)),
            Some(damage) => {
                self.remove_blob(sha256)?;
                Ok(BlobLookup::Removed(damage))
            }
        }
    }

    /// How the blob at `path` fails its checks, if it does.
    fn blob_damage(&self, sha256: &str, path: &Path, check: BlobCheck) -> Result<Option<String>> {
        if !fs::symlink_metadata(path)?.is_file() {
            return Ok(Some("it is not a regular file".into()));
        }
        let stamp = FileStamp::of(path)?;
        let memo = self.read_index::<BlobMemo>("blob", sha256);
        if let Some(memo) = &memo
            && memo.size != stamp.size
        {
            return Ok(Some(format!(
                "it has {} bytes, {} when it was stored",
                stamp.size, memo.size
            )));
        }
        let unchanged = memo.as_ref().is_some_and(|m| m.stamp == stamp);
        if unchanged && check == BlobCheck::WhenCheap && stamp.size > self.rehash_up_to {
            return Ok(None);
        }
        let actual = sha256_file(path, None)?;
        if actual != sha256 {
            return Ok(Some(format!("its content hashes to {actual}")));
        }
        if !unchanged {
            let size = memo.map_or(stamp.size, |m| m.size);
            self.write_index("blob", sha256, &BlobMemo { size, stamp })?;
        }
        Ok(None)
    }

    fn remove_blob(&self, sha256: &str) -> Result<()> {
        let path = self.blob_path(sha256);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing the damaged {}", path.display()));
            }
            _ => {}
        }
        let _ = fs::remove_file(self.index_path("blob", sha256));
        Ok(())
    }

    /// A temp file in the cache filesystem, so it can be renamed into place.
    pub fn temp_file(&self) -> Result<tempfile::NamedTempFile> {
        tempfile::Builder::new()
            .prefix("partial-")
            .tempfile_in(self.root.join("tmp"))
            .context("creating a temp file in the cache")
    }

    /// A temp dir in the cache filesystem.
    pub fn temp_dir(&self, prefix: &str) -> Result<tempfile::TempDir> {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(self.root.join("tmp"))
            .context("creating a temp dir in the cache")
    }

    /// Moves a fully written and verified temp file to `blobs/sha256/<sha256>`
    /// and records its size. A concurrent store of the same blob is harmless:
    /// both have the same verified content, and a rename replaces atomically.
    pub fn store_blob(&self, temp: tempfile::NamedTempFile, sha256: &str) -> Result<PathBuf> {
        temp.as_file().sync_all().context("syncing the downloaded file")?;
        let size = temp.as_file().metadata()?.len();
        let dest = self.blob_path(sha256);
        temp.persist(&dest)
            .with_context(|| format!("moving into the cache as {}", dest.display()))?;
        let stamp = FileStamp::of(&dest)?;
        self.write_index("blob", sha256, &BlobMemo { size, stamp })?;
        Ok(dest)
    }

    /// A directory for stage artifacts, created if needed.
    pub fn area(&self, name: &str) -> Result<PathBuf> {
        let dir = self.root.join(name);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }

    pub(crate) fn index_path(&self, kind: &str, key: &str) -> PathBuf {
        self.root
            .join("index")
            .join(format!("{kind}-{}.json", &sha256_hex(key)[..32]))
    }

    /// Reads a memo written by [`Cache::write_index`].
    pub fn read_index<T: for<'de> Deserialize<'de>>(&self, kind: &str, key: &str) -> Option<T> {
        let text = fs::read_to_string(self.index_path(kind, key)).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn write_index<T: Serialize>(&self, kind: &str, key: &str, value: &T) -> Result<()> {
        let path = self.index_path(kind, key);
        write_atomic(
            &path,
            serde_json::to_string_pretty(value)?.as_bytes(),
            &self.root.join("tmp"),
        )
    }
}

/// What identifies a local file's content cheaply between runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    pub size: u64,
    pub mtime_ns: i128,
    pub inode: u64,
    pub device: u64,
}

impl FileStamp {
    pub fn of(path: &Path) -> Result<FileStamp> {
        let meta = fs::metadata(path).with_context(|| format!("reading metadata of {}", path.display()))?;
        Ok(FileStamp {
            size: meta.len(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
            inode: meta.ino(),
            device: meta.dev(),
        })
    }
}

/// The file builds hold a shared lock on while they use the cache, and
/// `cache gc` an exclusive one while it removes entries.
const IN_USE_LOCK: &str = ".in-use.lock";

/// A hold on the cache: shared by builds, exclusive for `cache gc`. Released
/// when dropped (or when the process dies).
#[derive(Debug)]
pub struct CacheHold {
    _lock: File,
}

/// `cache gc` found a build using the cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the cache {} is in use by a running build; gc removes nothing while a build may read an entry (run it again when the build is done)",
    root.display()
)]
pub struct CacheInUse {
    pub root: PathBuf,
}

impl Cache {
    fn in_use_lock(&self) -> Result<File> {
        let path = self.root.join(IN_USE_LOCK);
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))
    }

    /// A build's hold: shared, so builds run side by side; `cache gc` waits
    /// for none of them and removes nothing while one holds it.
    pub fn hold_for_build(&self) -> Result<CacheHold> {
        let lock = self.in_use_lock()?;
        lock.lock_shared().context("locking the cache for this build")?;
        Ok(CacheHold { _lock: lock })
    }

    /// `cache gc`'s hold: exclusive, refused at once ([`CacheInUse`]) while
    /// a build holds the cache.
    pub fn hold_for_gc(&self) -> Result<CacheHold> {
        let lock = self.in_use_lock()?;
        match lock.try_lock() {
            Ok(()) => Ok(CacheHold { _lock: lock }),
            Err(fs::TryLockError::WouldBlock) => Err(CacheInUse {
                root: self.root.clone(),
            }
            .into()),
            Err(fs::TryLockError::Error(e)) => Err(e).context("locking the cache for gc"),
        }
    }
}

/// The work dir is in use by another run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the work dir {} is in use by another imgbuild run{}; wait for it to finish or pass another --work-dir",
    dir.display(),
    holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
)]
pub struct WorkDirBusy {
    pub dir: PathBuf,
    /// The pid the holder wrote into the lock file, when readable.
    pub holder: Option<u32>,
}

/// An exclusive lock on a work dir (`<work>/.lock`), released when dropped
/// or when the process ends, however it ends.
#[derive(Debug)]
pub struct WorkDirLock {
    _file: File,
}

/// Takes the work dir's lock, failing at once with [`WorkDirBusy`] when
/// another run holds it.
pub fn lock_work_dir(dir: &Path) -> Result<WorkDirLock> {
    let path = dir.join(".lock");
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(WorkDirBusy {
                dir: dir.to_path_buf(),
                holder: text.trim().parse().ok(),
            }
            .into());
        }
        Err(fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    // For the message another run prints; the lock itself is what counts.
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", std::process::id())?;
    Ok(WorkDirLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::atomic::{Placed, place_dir};

    fn cache() -> (tempfile::TempDir, Cache) {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("c")).unwrap();
        (dir, cache)
    }

    fn store(cache: &Cache, data: &[u8]) -> (String, PathBuf) {
        let mut temp = cache.temp_file().unwrap();
        temp.write_all(data).unwrap();
        let sha = sha256_hex(data);
        let path = cache.store_blob(temp, &sha).unwrap();
        (sha, path)
    }

    #[test]
    fn layout_and_index() {
        let (_dir, cache) = cache();
        assert!(cache.root().join("blobs/sha256").is_dir());
        assert_eq!(cache.lookup_blob("00").unwrap(), BlobLookup::Missing);
        let (sha, stored) = store(&cache, b"x");
        assert_eq!(cache.lookup_blob(&sha).unwrap(), BlobLookup::Hit(stored));
        cache.write_index("k", "key", &vec![1, 2]).unwrap();
        assert_eq!(cache.read_index::<Vec<i32>>("k", "key"), Some(vec![1, 2]));
        assert_eq!(cache.read_index::<Vec<i32>>("k", "other"), None);
        assert_eq!(fs::read_dir(cache.root().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn truncated_blob_is_removed() {
        let (_dir, cache) = cache();
        let (sha, path) = store(&cache, &[7u8; 4096]);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1024)
            .unwrap();
        let BlobLookup::Removed(why) = cache.lookup_blob(&sha).unwrap() else {
            panic!("a truncated blob was used");
        };
        assert!(why.contains("1024 bytes, 4096 when it was stored"), "{why}");
        assert!(!path.exists());
        assert_eq!(cache.lookup_blob(&sha).unwrap(), BlobLookup::Missing);
    }

    /// A large blob whose size and stat are unchanged is not re-hashed on a
    /// cheap lookup, but is on a full one; a changed stat forces a re-hash.
    #[test]
    fn large_blobs_are_rehashed_when_their_stat_changes() {
        let (_dir, cache) = cache();
        let cache = cache.with_rehash_limit(1024);
        let big = vec![1u8; 1025];
        let (sha, path) = store(&cache, &big);
        // Same size, different content, and the old mtime put back.
        let stamp = FileStamp::of(&path).unwrap();
        let mut file = File::options().write(true).open(&path).unwrap();
        file.write_all(b"X").unwrap();
        let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(stamp.mtime_ns as u64);
        file.set_modified(mtime).unwrap();
        drop(file);
        assert_eq!(FileStamp::of(&path).unwrap(), stamp);
        assert_eq!(cache.lookup_blob(&sha).unwrap(), BlobLookup::Hit(path.clone()));
        assert!(matches!(
            cache.lookup_blob_with(&sha, BlobCheck::Always).unwrap(),
            BlobLookup::Removed(_)
        ));

        // A touched file (stat changed, content intact) is re-hashed and kept.
        let (sha, path) = store(&cache, &big);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(std::time::UNIX_EPOCH)
            .unwrap();
        assert_eq!(cache.lookup_blob(&sha).unwrap(), BlobLookup::Hit(path.clone()));
        let memo: BlobMemo = cache.read_index("blob", &sha).unwrap();
        assert_eq!(memo.stamp, FileStamp::of(&path).unwrap());
    }

    #[test]
    fn small_blob_with_flipped_byte_is_removed() {
        let (_dir, cache) = cache();
        let (sha, path) = store(&cache, b"hello world");
        fs::write(&path, b"hello World").unwrap();
        let BlobLookup::Removed(why) = cache.lookup_blob(&sha).unwrap() else {
            panic!("a damaged blob was used");
        };
        assert!(why.contains("hashes to"), "{why}");
    }

    #[test]
    fn blob_without_memo_is_hashed_then_remembered() {
        let (_dir, cache) = cache();
        let sha = sha256_hex(b"abc");
        fs::write(cache.blob_path(&sha), b"abc").unwrap();
        assert!(matches!(cache.lookup_blob(&sha).unwrap(), BlobLookup::Hit(_)));
        let memo: BlobMemo = cache.read_index("blob", &sha).unwrap();
        assert_eq!(memo.size, 3);
        let bad = sha256_hex(b"abd");
        fs::write(cache.blob_path(&bad), b"abc").unwrap();
        assert!(matches!(cache.lookup_blob(&bad).unwrap(), BlobLookup::Removed(_)));
    }

    fn temp_with(cache: &Cache, content: &str) -> tempfile::TempDir {
        let temp = cache.temp_dir("entry-").unwrap();
        fs::write(temp.path().join("data"), content).unwrap();
        temp
    }

    #[test]
    fn place_dir_loser_uses_a_good_winner_and_replaces_a_bad_one() {
        let (_dir, cache) = cache();
        let dest = cache.area("things").unwrap().join("key");
        let good = |d: &Path| fs::read_to_string(d.join("data")).is_ok_and(|t| t == "good");
        assert_eq!(
            place_dir(temp_with(&cache, "good"), &dest, good).unwrap(),
            Placed::Ours
        );
        assert_eq!(
            place_dir(temp_with(&cache, "good"), &dest, good).unwrap(),
            Placed::Theirs
        );
        assert_eq!(fs::read_dir(cache.root().join("tmp")).unwrap().count(), 0);

        // A winner that fails its check is replaced.
        fs::write(dest.join("data"), "bad").unwrap();
        assert_eq!(
            place_dir(temp_with(&cache, "good"), &dest, good).unwrap(),
            Placed::Ours
        );
        assert_eq!(fs::read_to_string(dest.join("data")).unwrap(), "good");
        assert_eq!(fs::read_dir(cache.root().join("tmp")).unwrap().count(), 0);
        let names: Vec<_> = fs::read_dir(dest.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn place_dir_cleans_up_on_error() {
        let (_dir, cache) = cache();
        let dest = cache.root().join("no/such/parent/key");
        assert!(place_dir(temp_with(&cache, "x"), &dest, |_| true).is_err());
        assert_eq!(fs::read_dir(cache.root().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn work_dir_lock_is_exclusive_and_names_the_dir() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_work_dir(dir.path()).unwrap();
        let err = lock_work_dir(dir.path()).unwrap_err();
        let busy = err.downcast_ref::<WorkDirBusy>().expect("WorkDirBusy");
        assert_eq!(busy.dir, dir.path());
        assert_eq!(busy.holder, Some(std::process::id()));
        let text = err.to_string();
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        assert!(text.contains("in use by another imgbuild run"), "{text}");
        drop(held);
        lock_work_dir(dir.path()).unwrap();
    }

    #[test]
    fn gc_is_refused_while_a_build_holds_the_cache_and_builds_share_it() {
        let (_dir, cache) = cache();
        let build = cache.hold_for_build().unwrap();
        let other_build = cache.hold_for_build().unwrap();
        let refused = cache.hold_for_gc().unwrap_err();
        assert!(refused.is::<CacheInUse>(), "{refused:#}");
        drop(build);
        assert!(cache.hold_for_gc().unwrap_err().is::<CacheInUse>());
        drop(other_build);
        let gc = cache.hold_for_gc().unwrap();
        drop(gc);
    }
}
