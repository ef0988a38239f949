//! `imgbuild cache ls`, `cache gc` and `cache push`: what the local cache
//! holds, pruning it by age and size, and uploading its artifacts to a
//! shared remote ([`super::remote`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use serde::Serialize;

use super::Cache;
use super::remote::{self, Entry, Index};
use crate::io::hashing::{HashingWriter, is_sha256_hex};
use crate::stages::kernel::build::read_artifact;
use crate::transport::Transport;
use crate::ui::Ui;

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
                crate::io::root::tree_size(&item.path())?.0
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

/// What `cache push` did.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct PushReport {
    pub destination: String,
    pub pushed: Vec<Entry>,
    /// Already on the remote with the same archive.
    pub present: usize,
    /// Local entries that failed their checks and were not pushed.
    pub skipped: Vec<String>,
    pub bytes: u64,
}

/// A local artifact the remote can hold, as an archive to upload.
struct Pushable {
    area: &'static str,
    key: String,
    describe: String,
    /// The tar file itself (rootfs bases) or a dir to archive (kernels).
    path: PathBuf,
    is_dir: bool,
}

fn pushables(cache: &Cache, report: &mut PushReport) -> Result<Vec<Pushable>> {
    let mut found = Vec::new();
    let now = SystemTime::now();
    for entry in list(cache, now)? {
        match entry.area.as_str() {
            "kernels" if is_sha256_hex(&entry.name) => match read_artifact(&entry.path, &entry.name) {
                Ok(kernel) => found.push(Pushable {
                    area: remote::KERNELS,
                    key: entry.name,
                    describe: format!("kernel {}", kernel.release),
                    path: entry.path,
                    is_dir: true,
                }),
                Err(e) => report.skipped.push(format!("kernels/{}: {e:#}", entry.name)),
            },
            "rootfs-base" => {
                let Some(key) = entry.name.strip_suffix(".tar").filter(|k| is_sha256_hex(k)) else {
                    continue;
                };
                found.push(Pushable {
                    area: remote::ROOTFS_BASE,
                    key: key.to_string(),
                    describe: "rootfs base tarball".into(),
                    path: entry.path.clone(),
                    is_dir: false,
                });
            }
            _ => {}
        }
    }
    Ok(found)
}

/// Uploads every sound kernel and rootfs base of the local cache that the
/// remote lacks: each archive, then its entry, then `index.json`.
pub fn push(cache: &Cache, transport: &dyn Transport, ui: &Ui) -> Result<PushReport> {
    let mut report = PushReport {
        destination: transport.describe(),
        ..PushReport::default()
    };
    transport.ensure_root()?;
    let _lock = transport.lock()?;
    transport.remove_stale_temps()?;
    let mut index = read_index(transport)?;
    for item in pushables(cache, &mut report)? {
        let entry_rel = remote::entry_path(item.area, &item.key);
        let archive = archive_of(cache, &item)?;
        let served = transport
            .read(&entry_rel)?
            .and_then(|t| Entry::parse(&String::from_utf8_lossy(&t), item.area, &item.key).ok());
        if served.is_some_and(|e| e.sha256 == archive.sha256 && e.size == archive.size) {
            report.present += 1;
            continue;
        }
        ui.note(format!(
            "pushing {}/{} ({}, {} bytes)",
            item.area,
            &item.key[..16],
            item.describe,
            archive.size
        ));
        transport.put_file(&remote::archive_path(item.area, &item.key), &archive.path)?;
        transport.flush()?;
        let entry = Entry {
            format: remote::ENTRY_FORMAT,
            area: item.area.to_string(),
            key: item.key.clone(),
            sha256: archive.sha256.clone(),
            size: archive.size,
            describe: item.describe.clone(),
        };
        transport.put(&entry_rel, &serde_json::to_vec_pretty(&entry)?)?;
        index
            .entries
            .retain(|e| !(e.area == entry.area && e.key == entry.key));
        index.entries.push(entry.clone());
        report.bytes += archive.size;
        report.pushed.push(entry);
    }
    index.format = remote::ENTRY_FORMAT;
    index
        .entries
        .sort_by(|a, b| (&a.area, &a.key).cmp(&(&b.area, &b.key)));
    transport.put(Path::new("index.json"), &serde_json::to_vec_pretty(&index)?)?;
    Ok(report)
}

fn read_index(transport: &dyn Transport) -> Result<Index> {
    match transport.read(Path::new("index.json"))? {
        None => Ok(Index::default()),
        Some(data) => serde_json::from_slice(&data)
            .with_context(|| format!("parsing index.json on {}", transport.describe())),
    }
}

/// An archive ready to upload, with its sha256 and size.
struct Archive {
    path: PathBuf,
    sha256: String,
    size: u64,
    /// Keeps a temp archive alive while it is uploaded.
    _temp: Option<tempfile::NamedTempFile>,
}

fn archive_of(cache: &Cache, item: &Pushable) -> Result<Archive> {
    if !item.is_dir {
        let sha256 = crate::io::hashing::sha256_file(&item.path, None)?;
        return Ok(Archive {
            size: std::fs::metadata(&item.path)?.len(),
            path: item.path.clone(),
            sha256,
            _temp: None,
        });
    }
    let temp = cache.temp_file()?;
    let mut tar = tar::Builder::new(HashingWriter::new(std::io::BufWriter::new(temp.reopen()?)));
    tar.follow_symlinks(false);
    tar.mode(tar::HeaderMode::Deterministic);
    let walk = walkdir::WalkDir::new(&item.path).min_depth(1).sort_by_file_name();
    for found in walk {
        let found = found.with_context(|| format!("walking {}", item.path.display()))?;
        let rel = found.path().strip_prefix(&item.path).expect("under the entry");
        tar.append_path_with_name(found.path(), rel)
            .with_context(|| format!("archiving {}", found.path().display()))?;
    }
    let writer = tar.into_inner()?;
    let size = writer.written();
    let (sha256, buffered) = writer.finish();
    buffered
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing the archive: {}", e.error()))?;
    Ok(Archive {
        path: temp.path().to_path_buf(),
        sha256,
        size,
        _temp: Some(temp),
    })
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
