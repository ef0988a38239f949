//! The content-addressed cache (`$IMGBUILD_CACHE`, default `~/.cache/imgbuild`).
//!
//! Layout:
//! - `blobs/sha256/<hex>`: downloaded or imported files, named by their content;
//! - `sources/<hex>/`: pristine extracted source trees, by tarball hash;
//! - `<area>/<key>/`: stage artifacts by cache key (kernels, rootfs, ...);
//! - `index/`: small JSON memos (hash of a local file by path + size + mtime);
//! - `tmp/`: temp files; everything is written here and renamed into place.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::io::hashing::sha256_hex;

#[derive(Clone, Debug)]
pub struct Cache {
    root: PathBuf,
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
        Ok(Cache { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn blob_path(&self, sha256: &str) -> PathBuf {
        self.root.join("blobs/sha256").join(sha256)
    }

    pub fn lookup_blob(&self, sha256: &str) -> Option<PathBuf> {
        let path = self.blob_path(sha256);
        path.is_file().then_some(path)
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

    /// Moves a fully written and verified temp file to `blobs/sha256/<sha256>`.
    pub fn store_blob(&self, temp: tempfile::NamedTempFile, sha256: &str) -> Result<PathBuf> {
        temp.as_file().sync_all().context("syncing the downloaded file")?;
        let dest = self.blob_path(sha256);
        temp.persist(&dest)
            .with_context(|| format!("moving into the cache as {}", dest.display()))?;
        Ok(dest)
    }

    /// A directory for stage artifacts, created if needed.
    pub fn area(&self, name: &str) -> Result<PathBuf> {
        let dir = self.root.join(name);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }

    fn index_path(&self, kind: &str, key: &str) -> PathBuf {
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

/// Writes `data` to `path` through a temp file in `tmp_dir` and a rename, so
/// readers see the old content or the new, never half of it.
pub fn write_atomic(path: &Path, data: &[u8], tmp_dir: &Path) -> Result<()> {
    use std::io::Write;
    let mut temp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(tmp_dir)
        .with_context(|| format!("creating a temp file in {}", tmp_dir.display()))?;
    temp.write_all(data)?;
    temp.as_file().sync_all()?;
    temp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// [`write_atomic`] with the temp file beside `path`.
pub fn write_file_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_atomic(path, data, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_index() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("c")).unwrap();
        assert!(cache.root().join("blobs/sha256").is_dir());
        assert!(cache.lookup_blob("00").is_none());
        let mut temp = cache.temp_file().unwrap();
        std::io::Write::write_all(&mut temp, b"x").unwrap();
        let stored = cache.store_blob(temp, &sha256_hex("x")).unwrap();
        assert_eq!(cache.lookup_blob(&sha256_hex("x")), Some(stored));
        cache.write_index("k", "key", &vec![1, 2]).unwrap();
        assert_eq!(cache.read_index::<Vec<i32>>("k", "key"), Some(vec![1, 2]));
        assert_eq!(cache.read_index::<Vec<i32>>("k", "other"), None);
        assert_eq!(fs::read_dir(cache.root().join("tmp")).unwrap().count(), 0);
    }
}
