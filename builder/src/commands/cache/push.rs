//! `imgbuild cache push`: uploads the local cache's sound kernels and rootfs
//! bases to a shared remote ([`crate::cache::remote`]), each entry signed
//! with `--gpg-key`. It lives with the command, above the kernel stage whose
//! artifacts it checks before upload.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::cache::Cache;
use crate::cache::admin::list;
use crate::cache::remote::{self, Entry, Index};
use crate::io::gpg;
use crate::io::hashing::{HashingWriter, is_sha256_hex};
use crate::stage::Key;
use crate::stages::kernel::build::read_artifact;
use crate::transport::Transport;
use crate::ui::Ui;

/// The key that signs each entry (`--gpg-key`, `--gpg-homedir`).
#[derive(Clone, Debug)]
pub struct Signer {
    pub homedir: Option<PathBuf>,
    /// The primary fingerprint of the one key `--gpg-key` names.
    pub fingerprint: String,
}

impl Signer {
    pub fn new(key: &str, homedir: Option<PathBuf>) -> Result<Signer> {
        let fingerprint = gpg::primary_fingerprint(key, homedir.as_deref())?;
        Ok(Signer { homedir, fingerprint })
    }

    fn sign(&self, data: &[u8]) -> Result<Vec<u8>> {
        gpg::sign_detached(data, &self.fingerprint, self.homedir.as_deref())
    }

    /// Whether `signature` is a good one of `data` by this key.
    fn signed(&self, data: &[u8], signature: Option<&[u8]>) -> Result<bool> {
        let Some(signature) = signature else {
            return Ok(false);
        };
        let verification = gpg::verify_detached(data, signature, self.homedir.as_deref())?;
        Ok(verification.good_by(&self.fingerprint))
    }
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
    /// What the key was built from (the kernel's `key.json`).
    inputs: BTreeMap<String, String>,
    /// The tar file itself (rootfs bases) or a dir to archive (kernels).
    path: PathBuf,
    is_dir: bool,
}

fn pushables(cache: &Cache, report: &mut PushReport) -> Result<Vec<Pushable>> {
    let mut found = Vec::new();
    let now = SystemTime::now();
    for entry in list(cache, now)? {
        match entry.area.as_str() {
            "kernels" if is_sha256_hex(&entry.name) => match kernel(&entry.path, &entry.name) {
                Ok(pushable) => found.push(pushable),
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
                    inputs: BTreeMap::new(),
                    path: entry.path.clone(),
                    is_dir: false,
                });
            }
            _ => {}
        }
    }
    Ok(found)
}

/// A sound kernel of the local cache, with the inputs its key was built from.
fn kernel(dir: &Path, key: &str) -> Result<Pushable> {
    let kernel = read_artifact(dir, key)?;
    Ok(Pushable {
        area: remote::KERNELS,
        key: key.to_string(),
        describe: format!("kernel {}", kernel.release),
        inputs: kernel_inputs(dir, key)?,
        path: dir.to_path_buf(),
        is_dir: true,
    })
}

/// The kernel's `key.json` inputs (empty when an older imgbuild kept none);
/// they must hash to its key.
fn kernel_inputs(dir: &Path, key: &str) -> Result<BTreeMap<String, String>> {
    let path = dir.join("key.json");
    let text = match std::fs::read_to_string(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        read => read.with_context(|| format!("reading {}", path.display()))?,
    };
    let recorded: Key = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if recorded.digest() != key {
        bail!(
            "{} hashes to {}, not to its key",
            path.display(),
            recorded.digest()
        );
    }
    Ok(recorded.inputs)
}

/// What the remote already serves of an entry.
enum Served {
    /// This entry, signed by this key (or unsigned when pushing unsigned).
    Current,
    /// This archive, under another entry or signature.
    SameArchive,
    Nothing,
}

fn served(transport: &dyn Transport, entry: &Entry, bytes: &[u8], signer: Option<&Signer>) -> Result<Served> {
    let Some(served) = transport.read(&remote::entry_path(&entry.area, &entry.key))? else {
        return Ok(Served::Nothing);
    };
    let parsed = Entry::parse(&served, &entry.area, &entry.key);
    if !parsed.is_ok_and(|e| e.sha256 == entry.sha256 && e.size == entry.size) {
        return Ok(Served::Nothing);
    }
    let signed = match signer {
        None => true,
        Some(signer) => {
            let signature = transport.read(&remote::signature_path(&entry.area, &entry.key))?;
            signer.signed(bytes, signature.as_deref())?
        }
    };
    Ok(if served == bytes && signed {
        Served::Current
    } else {
        Served::SameArchive
    })
}

/// Writes the entry's signature (or removes a stale one), then the entry.
fn put_entry(transport: &dyn Transport, entry: &Entry, bytes: &[u8], signer: Option<&Signer>) -> Result<()> {
    let signature = remote::signature_path(&entry.area, &entry.key);
    match signer {
        Some(signer) => transport.put(&signature, &signer.sign(bytes)?)?,
        None => transport.remove(&signature)?,
    }
    transport.put(&remote::entry_path(&entry.area, &entry.key), bytes)
}

/// Uploads every sound kernel and rootfs base of the local cache that the
/// remote lacks: each archive, then its entry's signature (by `signer`)
/// and its entry, then `index.json`.
pub fn push(
    cache: &Cache,
    transport: &dyn Transport,
    signer: Option<&Signer>,
    ui: &Ui,
) -> Result<PushReport> {
    let mut report = PushReport {
        destination: transport.describe(),
        ..PushReport::default()
    };
    transport.ensure_root()?;
    let _lock = transport.lock()?;
    transport.remove_stale_temps()?;
    let mut index = read_index(transport)?;
    for item in pushables(cache, &mut report)? {
        let archive = archive_of(cache, &item)?;
        let entry = Entry {
            format: remote::ENTRY_FORMAT,
            area: item.area.to_string(),
            key: item.key.clone(),
            sha256: archive.sha256.clone(),
            size: archive.size,
            describe: item.describe.clone(),
            inputs: item.inputs.clone(),
        };
        let bytes = entry.signed_bytes()?;
        let state = served(transport, &entry, &bytes, signer)?;
        if matches!(state, Served::Current) {
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
        if matches!(state, Served::Nothing) {
            transport.put_file(&remote::archive_path(item.area, &item.key), &archive.path)?;
            transport.flush()?;
            report.bytes += archive.size;
        }
        put_entry(transport, &entry, &bytes, signer)?;
        index
            .entries
            .retain(|e| !(e.area == entry.area && e.key == entry.key));
        index.entries.push(entry.clone());
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
