//! `imgbuild cache ls` and `cache gc`: what the local cache holds, and
//! pruning it by age and size.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use serde::Serialize;

use super::Cache;

/// One entry of the local cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct LocalEntry {
    /// `kernels`, `rootfs-base`, `sources`, `blobs`, `apt-archives`.
    pub area: String,
    pub name: String,
    #[serde(skip)]
    pub path: PathBuf,
    pub bytes: u64,
    /// Seconds since it was written or last used.
    pub age_seconds: u64,
}

/// The areas `ls` and `gc` know, with how their entries are named. The
/// ccache area is ccache's own (`ccache -M` bounds it).
const LISTED: [&str; 5] = [
    "kernels",
    "rootfs-base",
    "sources",
    "blobs/sha256",
    "apt-archives",
];

/// Every entry of the cache, oldest first.
pub fn list(cache: &Cache, now: SystemTime) -> Result<Vec<LocalEntry>> {
    let mut entries = Vec::new();
    for area in LISTED {
        let dir = cache.root().join(area);
        let Ok(read) = std::fs::read_dir(&dir) else {
            continue;
        };
        for item in read {
            let item = item.with_context(|| format!("listing {}", dir.display()))?;
            let name = item.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let meta = std::fs::symlink_metadata(item.path())?;
            let bytes = if meta.is_dir() {
                emberrtos_contract::io::root::tree_size(&item.path())?.0
            } else {
                meta.len()
            };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            entries.push(LocalEntry {
                area: area.trim_end_matches("/sha256").to_string(),
                name,
                path: item.path(),
                bytes,
                age_seconds: now.duration_since(modified).unwrap_or_default().as_secs(),
            });
        }
    }
    entries.sort_by(|a, b| b.age_seconds.cmp(&a.age_seconds).then(a.name.cmp(&b.name)));
    Ok(entries)
}

/// Pure: which entries (given oldest first) `gc` removes: everything older
/// than `older_than`, then the oldest until the rest fit in `max_bytes`.
pub fn plan_gc(entries: &[LocalEntry], older_than: Option<Duration>, max_bytes: Option<u64>) -> Vec<usize> {
    let mut remove: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| older_than.is_some_and(|age| e.age_seconds >= age.as_secs()))
        .map(|(i, _)| i)
        .collect();
    if let Some(limit) = max_bytes {
        let mut kept: u64 = entries
            .iter()
            .enumerate()
            .filter(|(i, _)| !remove.contains(i))
            .map(|(_, e)| e.bytes)
            .sum();
        for (i, entry) in entries.iter().enumerate() {
            if kept <= limit {
                break;
            }
            if !remove.contains(&i) {
                remove.push(i);
                kept -= entry.bytes;
            }
        }
    }
    remove.sort_unstable();
    remove
}

/// Removes one entry: moved aside first, so no reader sees it half removed.
pub fn remove_entry(cache: &Cache, entry: &LocalEntry) -> Result<()> {
    let trash = cache.temp_dir("gc-")?;
    std::fs::rename(&entry.path, trash.path().join("entry"))
        .with_context(|| format!("moving {} aside", entry.path.display()))?;
    let _ = std::fs::remove_file(cache.index_path("blob", &entry.name));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, bytes: u64, age_seconds: u64) -> LocalEntry {
        LocalEntry {
            area: "kernels".into(),
            name: name.into(),
            path: PathBuf::from(name),
            bytes,
            age_seconds,
        }
    }

    #[test]
    fn gc_removes_the_old_then_the_oldest_until_the_rest_fits() {
        let entries = [entry("a", 50, 900), entry("b", 30, 500), entry("c", 20, 10)];
        let day = Duration::from_secs(600);
        assert_eq!(plan_gc(&entries, Some(day), None), vec![0]);
        assert_eq!(plan_gc(&entries, None, Some(60)), vec![0]);
        assert_eq!(plan_gc(&entries, None, Some(20)), vec![0, 1]);
        assert_eq!(plan_gc(&entries, None, Some(0)), vec![0, 1, 2]);
        assert_eq!(plan_gc(&entries, Some(day), Some(20)), vec![0, 1]);
        assert!(plan_gc(&entries, None, None).is_empty());
        assert!(plan_gc(&entries, None, Some(100)).is_empty());
    }
}
