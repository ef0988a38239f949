//! Atomic writes: a file or a directory appears whole at its path or not
//! at all, so a kill in the middle leaves nothing that looks complete.

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

/// Writes `data` to `path` through a temp file in `tmp_dir` and a rename, so
/// readers see the old content or the new, never half of it.
pub fn write_atomic(path: &Path, data: &[u8], tmp_dir: &Path) -> Result<()> {
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

/// Whose entry [`place_dir`] left at the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// Our temp dir was renamed into place.
    Ours,
    /// Another run inserted a good entry first; ours was removed.
    Theirs,
}

/// Renames a complete temp dir to `dest`: the commit point of an insert into
/// a cache that other runs share. When `dest` already exists (another run
/// won the race), `is_good(dest)` decides: a good entry is used and our copy
/// removed; a bad one is replaced by ours. The temp dir never outlives this
/// call, whatever happens.
pub fn place_dir(temp: tempfile::TempDir, dest: &Path, is_good: impl Fn(&Path) -> bool) -> Result<Placed> {
    const TRIES: usize = 3;
    for _ in 0..TRIES {
        let error = match fs::rename(temp.path(), dest) {
            Ok(()) => {
                // The path is gone; nothing is left to clean up.
                let _ = temp.keep();
                return Ok(Placed::Ours);
            }
            Err(e) => e,
        };
        if fs::symlink_metadata(dest).is_err() {
            return Err(error)
                .with_context(|| format!("moving {} to {}", temp.path().display(), dest.display()));
        }
        if is_good(dest) {
            return Ok(Placed::Theirs);
        }
        discard(dest)?;
    }
    anyhow::bail!(
        "{} keeps being replaced by another run with a bad entry; gave up after {TRIES} tries",
        dest.display()
    )
}

/// Removes `path` (a bad cache entry) by first moving it aside, so no reader
/// ever sees it half removed.
pub fn discard(path: &Path) -> Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    let trash = tempfile::Builder::new()
        .prefix(".discard-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a temp dir in {}", parent.display()))?;
    match fs::rename(path, trash.path().join("entry")) {
        // Another run moved it away first.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("moving the bad entry {} aside", path.display())),
        // Dropping `trash` removes the entry.
        Ok(()) => Ok(()),
    }
}
