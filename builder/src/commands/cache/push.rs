//! `imgbuild cache push`: uploads the local cache's sound kernels and rootfs
//! bases to a shared remote ([`crate::cache::remote`]). It lives with the
//! command, above the kernel stage whose artifacts it checks before upload.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::cache::Cache;
use crate::cache::admin::list;
use crate::cache::remote::{self, Entry, Index};
use crate::io::hashing::{HashingWriter, is_sha256_hex};
use crate::stages::kernel::build::read_artifact;
use crate::transport::Transport;
use crate::ui::Ui;

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
