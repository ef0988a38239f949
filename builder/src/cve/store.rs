//! The vulnerability data `imgbuild cve-db update` keeps in the cache: the
//! file itself as a blob (`blobs/sha256/…`), and `cve-db/current.json`
//! naming it with where it came from and its date. The note is written
//! only after every record of the file was read and checked, so a kill or
//! a bad file leaves the data kept before; a report re-reads the blob and
//! checks its hash against the note.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result, bail};
use emberrtos_contract::error::BadInput;
use serde::{Deserialize, Serialize};

use super::data::{self, DataFile, DataRead, Format, MAX_DATA_BYTES};
use super::tracker::Wanted;
use crate::cache::Cache;
use crate::cache::download::{self, FetchOptions, Fetched};
use crate::io::hashing::is_sha256_hex;
use crate::ui::Ui;

/// Where `cve-db update` fetches from without `--from`.
pub const DEFAULT_URL: &str = "https://security-tracker.debian.org/tracker/data/json";

const AREA: &str = "cve-db";
const CURRENT: &str = "current.json";

/// The largest `current.json` read.
const MAX_NOTE_BYTES: u64 = 64 << 10;

/// Where data comes from: a URL, or a file on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    Url(String),
    File(PathBuf),
}

impl Origin {
    /// `https://…` or `http://…` is a URL; text without a scheme, a file.
    pub fn parse(text: &str) -> Result<Origin, String> {
        if text.starts_with("https://") || text.starts_with("http://") {
            url::Url::parse(text).map_err(|e| format!("{text:?} is not a valid URL: {e}"))?;
            return Ok(Origin::Url(text.to_string()));
        }
        if text.contains("://") {
            return Err(format!("{text:?}: only https:// and http:// URLs, or a file"));
        }
        if text.is_empty() {
            return Err("an empty name".into());
        }
        Ok(Origin::File(PathBuf::from(text)))
    }
}

/// What the cache holds: `cve-db/current.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Current {
    /// [`Format::as_str`].
    pub format: String,
    /// The URL or file it came from.
    pub source: String,
    pub sha256: String,
    pub bytes: u64,
    /// The data's date (RFC 3339, UTC): the server's `Last-Modified`
    /// (else the time of the download), or the file's modification time.
    pub date: String,
    /// When `cve-db update` kept it (RFC 3339, UTC).
    pub updated: String,
    /// What the check of every record counted.
    pub summary: String,
}

/// Fetches or imports `origin` (kept only with hash `sha256`, when given),
/// reads and checks all of it, and only then makes it the cache's data.
pub fn update(
    cache: &Cache,
    origin: &Origin,
    sha256: Option<&str>,
    options: &FetchOptions,
    ui: &Ui,
) -> Result<Current> {
    let _hold = cache.hold_for_build()?;
    let kept = current(cache).ok().map(|current| current.sha256);
    let (fetched, date, source) = fetch(cache, origin, sha256, options, ui)?;
    ui.note(format!("checking every record of {}", fetched.origin));
    let read = check_all(&fetched).inspect_err(|_| {
        // The refused file's copy goes, unless it is the data kept before.
        if !fetched.cached && kept.as_deref() != Some(fetched.sha256.as_str()) {
            let _ = std::fs::remove_file(&fetched.path);
        }
    })?;
    // A date ahead of this clock would keep the data young for ever.
    let date = date.min(SystemTime::now());
    let current = Current {
        format: read.format.as_str().to_string(),
        source,
        sha256: read.sha256,
        bytes: read.bytes,
        date: rfc3339(date),
        updated: rfc3339(SystemTime::now()),
        summary: read.summary,
    };
    let note = cache.area(AREA)?.join(CURRENT);
    let text = serde_json::to_string_pretty(&current)?;
    crate::io::atomic::write_atomic(&note, text.as_bytes(), &cache.root().join("tmp"))?;
    Ok(current)
}

/// `origin` in the cache's blob store, its date, and its name for reports
/// (the URL, or the file's absolute path).
fn fetch(
    cache: &Cache,
    origin: &Origin,
    sha256: Option<&str>,
    options: &FetchOptions,
    ui: &Ui,
) -> Result<(Fetched, SystemTime, String)> {
    match origin {
        Origin::Url(url) => {
            let options = FetchOptions {
                max_bytes: Some(MAX_DATA_BYTES),
                ..options.clone()
            };
            let dated = download::fetch_url_dated(url, sha256, cache, &options, ui)?;
            let date = dated.last_modified.unwrap_or_else(SystemTime::now);
            Ok((dated.fetched, date, url.clone()))
        }
        Origin::File(path) => {
            check_file(path)?;
            let fetched = download::import_file(path, sha256, cache, ui)?;
            let modified = std::fs::metadata(path).and_then(|meta| meta.modified());
            let date = modified.with_context(|| format!("reading the date of {}", path.display()))?;
            let source = std::path::absolute(path)?.display().to_string();
            Ok((fetched, date, source))
        }
    }
}

/// Refuses, before it is copied, what cannot be data: not a regular file
/// (a FIFO, a device), or larger than any data read.
fn check_file(path: &Path) -> Result<()> {
    let bad = |message: String| BadInput::new("--from", format!("{}: {message}", path.display()));
    let (_, meta) = crate::io::open_regular(path).map_err(bad)?;
    if meta.len() > MAX_DATA_BYTES {
        return Err(bad(format!(
            "{} bytes, more than the {MAX_DATA_BYTES} read",
            meta.len()
        ))
        .into());
    }
    Ok(())
}

/// Reads every record of a fetched file: it must be whole, of one of the
/// two forms, and hold something.
fn check_all(fetched: &Fetched) -> Result<DataRead> {
    let file = DataFile {
        path: &fetched.path,
        shown: &fetched.origin,
        option: "--from",
    };
    let everything = Wanted {
        release: None,
        sources: None,
    };
    let read = data::read(file, &everything)?;
    if read.sha256 != fetched.sha256 {
        bail!(
            "{}: the cache's copy changed while it was read (sha256 {}, now {}); run again",
            fetched.origin,
            fetched.sha256,
            read.sha256
        );
    }
    if read.entries == 0 {
        let message = format!("{}: holds no record ({})", fetched.origin, read.summary);
        return Err(BadInput::new("--from", message).into());
    }
    Ok(read)
}

fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    rtreport::utc::rfc3339(since.as_secs())
}

impl Current {
    /// The data's date.
    pub fn date(&self) -> Option<SystemTime> {
        humantime::parse_rfc3339(&self.date).ok()
    }

    /// Whether every field is of its kind: a hash (never a path), a known
    /// form, two dates.
    fn is_sound(&self) -> bool {
        let formats = [Format::TrackerJson, Format::OsvZip].map(Format::as_str);
        is_sha256_hex(&self.sha256)
            && formats.contains(&self.format.as_str())
            && self.date().is_some()
            && humantime::parse_rfc3339(&self.updated).is_ok()
    }
}

/// The cache's data, as `cve-db update` noted it.
pub fn current(cache: &Cache) -> Result<Current> {
    let note = cache.root().join(AREA).join(CURRENT);
    let advice = "run `imgbuild cve-db update`, or name a file";
    let (file, _) = match crate::io::open_regular(&note) {
        Ok(opened) => opened,
        Err(_) if !note.exists() => {
            bail!(
                "the cache {} holds no vulnerability data: {advice}",
                cache.root().display()
            )
        }
        Err(e) => bail!("{}: {e}: {advice}", note.display()),
    };
    let text = crate::transport::bounded::read_capped(file, MAX_NOTE_BYTES)
        .with_context(|| format!("{} is larger than {MAX_NOTE_BYTES} bytes", note.display()))?;
    let current: Current = serde_json::from_slice(&text)
        .ok()
        .filter(Current::is_sound)
        .with_context(|| format!("{} is damaged: {advice}", note.display()))?;
    Ok(current)
}

/// Reads the cache's data, keeping what `wanted` names; it must still be
/// the file `cve-db update` checked.
pub fn read_current(cache: &Cache, wanted: &Wanted) -> Result<(DataRead, Current)> {
    let current = current(cache)?;
    let blob = cache.blob_path(&current.sha256);
    let shown = format!("the cached data from {}", crate::io::clean(&current.source));
    let file = DataFile {
        path: &blob,
        shown: &shown,
        option: "--cache-dir",
    };
    if !blob.exists() {
        bail!(
            "{shown} ({}) is gone from the cache: run `imgbuild cve-db update`",
            blob.display()
        );
    }
    let read = data::read(file, wanted)?;
    if read.sha256 != current.sha256 || read.format.as_str() != current.format {
        bail!(
            "{shown} ({}) is not what `imgbuild cve-db update` checked (sha256 {}, now {}): run it again",
            blob.display(),
            current.sha256,
            read.sha256
        );
    }
    Ok((read, current))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_urls_or_files() {
        assert_eq!(
            Origin::parse("https://security-tracker.debian.org/tracker/data/json"),
            Ok(Origin::Url(DEFAULT_URL.into()))
        );
        assert_eq!(Origin::parse("json"), Ok(Origin::File("json".into())));
        assert!(
            Origin::parse("ftp://host/json")
                .unwrap_err()
                .contains("only https://")
        );
        assert!(
            Origin::parse("https://[::1/x")
                .unwrap_err()
                .contains("not a valid URL")
        );
        assert!(Origin::parse("").is_err());
    }

    #[test]
    fn a_note_naming_a_path_is_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let error = current(&cache).unwrap_err().to_string();
        assert!(error.contains("holds no vulnerability data"), "{error}");
        let note = Current {
            format: "debian-security-tracker-json".into(),
            source: "x".into(),
            sha256: "../../etc/shadow".into(),
            bytes: 1,
            date: "2026-12-01T00:00:00Z".into(),
            updated: "2026-12-01T00:00:00Z".into(),
            summary: String::new(),
        };
        let path = cache.area(AREA).unwrap().join(CURRENT);
        std::fs::write(&path, serde_json::to_vec(&note).unwrap()).unwrap();
        let error = current(&cache).unwrap_err().to_string();
        assert!(error.contains("is damaged"), "{error}");
    }
}
